"""Training under a memory budget (issue 14, item 4): ebb's training step
compiled with ebb_compile_options.memory_budget, from no budget down to the
least peak ebb can plan, against PyTorch eager without checkpointing and
with torch.utils.checkpoint placed every ~sqrt(n) blocks, side by side in
one run, on:

- a deep residual tower: specs/residual_tower.yaml with depth 64, width 512,
  batch 64 (stem, 64 x also(linear -> gelu -> layer_norm), head), cross
  entropy on 10 classes; PyTorch checkpoints with
  checkpoint_sequential(blocks, 8, h): 8 segments of 8 blocks, the last one
  not checkpointed (what checkpoint_sequential does);
- the transformer workload at its compute size (specs/bench/transformer.yaml,
  d 512, 8 heads, ff 2048, batch 16, seq 64), mse; its 2 encoder layers are
  each wrapped in checkpoint() (sqrt(2) rounds to one layer per segment).

Budgets: none, then the no-recompute peak divided by 2, 3, 4, 6, 8, ... until
ebb_compile refuses (EBB_ERR_BUDGET); its message names the least peak its
search reached, in bytes, and a last plan is compiled for exactly that: the
least feasible (from a message that gives only MiB to 0.1, that figure
rounded up by 0.05 MiB). Two more plans compare at equal memory:
the budget set to PyTorch-with-checkpoint's measured peak, for ebb as it is
(updates inside the backward, so gradients die at their update) and for ebb
with ebb_train_options.updates_after_backward (every gradient alive until
the updates, as torch.optim's step() needs them).

Every engine: the same initial weights (ebb's, exported), input and target,
AdamW lr 1e-3 (torch's other defaults), the same intra-op threads. Each plan
and each PyTorch variant first runs two steps from the initial weights (the
losses must agree: bit for bit between ebb's plans, whose dropout masks are
drawn from the step's seed and step index whatever the budget; 1e-3 relative
with PyTorch, 1e-2 where dropout draws its own masks there), then one step
measures the peak, then rounds of timed steps; ebb's
process and this one take turns by rounds, the first side alternating.

Peaks are above the bytes live when the step starts (parameters, optimizer
state, input, target): ebb's by its counting allocator
(ebb_run_stats.measured_peak_bytes) next to the plan's
(ebb_run_stats.planned_peak_bytes), PyTorch's from the profiler's memory
events around one step (run.py's torch_train_peak).

glibc's allocator. Both engines allocate tensors with posix_memalign/free,
and glibc by default moves its mmap threshold with the sizes it has seen and
gives the top of the heap back to the kernel when enough of it is free, so
whether a step's tensors land in fresh pages that fault in (and are zeroed by
the kernel) depends on the process's allocation history. On this tower that
was up to 100 ms of a 140 ms step, varying from process to process and run to
run, for either engine. This section pins both: M_MMAP_THRESHOLD 32 MiB (the
most glibc allows) and M_TRIM_THRESHOLD 1 GiB, through the environment for
ebb's process and mallopt() in this one, before any model is made, so every
engine reuses heap pages. EBB_BENCH_MALLOC=default leaves glibc's defaults.

Run through run.py (`bash tests/bench/run.sh BUILD --only remat`), which sets
the threads before torch loads.
"""
import ctypes
import inspect
import math
import os
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import run as bench  # Ebb-like process handling, load_export, profiled_peak, rendering
import torch_models

# torch 2.x asks for use_reentrant explicitly (a warning now, an error
# announced); 1.13's checkpoint_sequential does not take it. True is what
# 1.13 does without it, so both versions checkpoint the same way.
CKPT_KW = ({"use_reentrant": True}
           if "use_reentrant" in inspect.signature(checkpoint_sequential).parameters else {})

MIB = 1 << 20
FRACTIONS = [2, 3, 4, 6, 8, 12, 16, 24, 32]
LOSS_TOL = {"deterministic": 1e-3, "random": 1e-2}

WORKLOADS = [
    {"name": "residual_tower", "spec": "specs/residual_tower.yaml",
     "params": {"d": 512, "depth": 64}, "binds": {"batch": 64}, "loss": "cross_entropy",
     "segments": 8, "rounds": 6, "per_round": 1, "random": None,
     "what": "64 x also(linear -> gelu -> layer_norm), d 512, batch 64"},
    {"name": "transformer", "spec": "specs/bench/transformer.yaml",
     "params": {"d": 512, "heads": 8, "ff": 2048}, "binds": {"batch": 16, "seq": 64},
     "loss": "mse", "segments": 2, "rounds": 5, "per_round": 1,
     "random": "dropout draws its own masks in each engine",
     "what": "2 post-norm encoder layers, d 512, 8 heads, ff 2048, batch 16, seq 64"},
]


class Residual(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))

    def forward(self, h):
        return h + self.f(h)


class DeepTower(nn.Module):
    """stem, depth x (h + layer_norm(gelu(linear(h)))), head; with segments,
    the blocks run through checkpoint_sequential."""

    def __init__(self, d, depth, segments=0):
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.blocks = nn.Sequential(*[Residual(d) for _ in range(depth)])
        self.head = nn.Linear(d, 10)
        self.segments = segments

    def forward(self, x):
        h = self.stem(x)
        if self.segments:
            h = checkpoint_sequential(self.blocks, self.segments, h, **CKPT_KW)
        else:
            h = self.blocks(h)
        return self.head(h)

    def ebb_order(self):
        ps = [self.stem.weight, self.stem.bias]
        for b in self.blocks:
            ps += [b.f[0].weight, b.f[0].bias, b.f[2].weight, b.f[2].bias]
        return ps + [self.head.weight, self.head.bias]


class CheckpointedTransformer(torch_models.Transformer):
    """The bench transformer (training form) with every encoder layer in
    torch.utils.checkpoint.checkpoint."""

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = checkpoint(layer, h, **CKPT_KW)
        return h


def build(w, ckpt):
    p = w["params"]
    if w["name"] == "residual_tower":
        return DeepTower(p["d"], p["depth"], w["segments"] if ckpt else 0)
    cls = CheckpointedTransformer if ckpt else torch_models.Transformer
    return cls(p["d"], p["heads"], p["ff"], ebb_dropouts=True)


def torch_variant(w, prefix, ckpt):
    """A PyTorch model with ebb's initial values, its AdamW and its step."""
    tensors = bench.load_export(prefix)
    named = [t for t in tensors if not t[0].startswith(("input:", "target:"))]
    x, y = dict(tensors)["input:x"], dict(tensors)["target:y"]
    model = build(w, ckpt).train()
    order = model.ebb_order()
    if len(order) != len(named):
        raise RuntimeError("%s: PyTorch has %d parameters, ebb's plan %d"
                           % (w["name"], len(order), len(named)))
    with torch.no_grad():
        for p, (name, v) in zip(order, named):
            if tuple(p.shape) != tuple(v.shape):
                raise RuntimeError("%s: %s is %s in ebb, %s in PyTorch"
                                   % (w["name"], name, tuple(v.shape), tuple(p.shape)))
            p.copy_(v)
    if w["loss"] == "cross_entropy":
        y, loss_fn = y.long(), F.cross_entropy
    else:
        loss_fn = F.mse_loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return {"model": model, "opt": opt, "step": step}


class RematProc(bench.Ebb):
    """The ebb_remat_bench process (same line protocol as ebb_bench's)."""


def least_from(message):
    """The least peak an ebb_compile refusal names: exact where it gives the
    bytes ("... and 5.0 MiB (5246976 bytes) at the least recomputing ..."),
    else rounded up past its 0.1 MiB printing."""
    m = re.search(r"\(([0-9]+) bytes\) at the least", message)
    if m:
        return int(m.group(1))
    m = re.search(r"and ([0-9.]+) (B|KiB|MiB|GiB) at the least", message)
    if not m:
        return None
    scale = {"B": 1, "KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30}[m.group(2)]
    step = 1 if m.group(2) == "B" else 0.05
    return int(math.ceil((float(m.group(1)) + step) * scale))


def run_workload(proc, w, out_dir, log):
    t_start = time.time()
    spec = os.path.join(bench.ROOT, w["spec"])
    prefix = os.path.join(out_dir, "remat_%s" % w["name"])
    setup = proc.ask("setup", spec, bench.csv(w["params"]), bench.csv(w["binds"]), w["loss"],
                     prefix)
    full = setup["no_recompute_peak_bytes"]
    plans = [dict(setup, index=0, label="none", after=0, compile_ms=None)]

    # PyTorch first: its checkpointed peak sets the equal-memory budgets
    pyt = {"PyTorch": torch_variant(w, prefix, False),
           "PyTorch ckpt": torch_variant(w, prefix, True)}
    for v in pyt.values():
        v["loss"] = [float(v["step"]().item()) for _ in range(2)]
        v["peak"] = bench.torch_train_peak(v["opt"], v["step"])

    def compile_plan(label, budget, after=0):
        r = proc.ask("compile", budget, after)
        if "nofit" in r:
            return r
        plans.append(dict(r, label=label, after=after))
        log("    %-28s compiled in %6.0f ms: peak %s" %
            (label, r["compile_ms"], r["peak_bytes"]))
        return r

    least = None
    for k in FRACTIONS:
        r = compile_plan("1/%d" % k, full // k)
        if "nofit" in r:
            least = least_from(r["nofit"])
            plans_refused = {"label": "1/%d" % k, "budget": full // k, "message": r["nofit"],
                             "compile_ms": r["compile_ms"]}
            break
    else:
        plans_refused = None
    if least is not None and all(p["label"] == "none" or least < p["budget"] for p in plans):
        r = compile_plan("least", least)
        if "nofit" in r:  # the printed figure rounded below the search's
            plans_refused["least_message"] = r["nofit"]
    # equal memory: PyTorch-with-checkpoint's peak as the budget; a plan
    # already under it is not compiled again
    ckpt_peak = pyt["PyTorch ckpt"]["peak"]
    eq = "= PyT ckpt peak"
    if ckpt_peak >= plans[0]["peak_bytes"]:
        plans[0]["also"] = eq
    else:
        compile_plan(eq, ckpt_peak)
    after = compile_plan("none, updates after", 0, after=1)
    if ckpt_peak >= after["peak_bytes"]:
        plans[-1]["also"] = eq + ", updates after"
    else:
        r = compile_plan(eq + ", updates after", ckpt_peak, after=1)
        if "nofit" in r:
            plans.append({"label": eq + ", updates after", "nofit": r["nofit"],
                          "compile_ms": r["compile_ms"], "budget": ckpt_peak, "after": 1})

    live = [p for p in plans if "nofit" not in p]
    for p in live:
        p["loss"] = proc.ask("check", p["index"])["loss"]
    for p in live:
        p["memory"] = proc.ask("measure", p["index"])

    # warm-up, then timed rounds; the two processes take turns, the first
    # side alternating, and each side's order reverses with it
    for p in live:
        proc.ask("round", p["index"], 1)
    for v in pyt.values():
        bench.torch_train_round(v["step"], 1)
    times = {id(p): [] for p in live}
    ptimes = {k: [] for k in pyt}
    for r in range(w["rounds"]):
        sides = ["ebb", "pytorch"] if r % 2 == 0 else ["pytorch", "ebb"]
        for side in sides:
            if side == "ebb":
                for p in (live if r % 2 == 0 else live[::-1]):
                    times[id(p)] += proc.ask("round", p["index"], w["per_round"])["ms"]
            else:
                for k in (list(pyt) if r % 2 == 0 else list(pyt)[::-1]):
                    ptimes[k] += bench.torch_train_round(pyt[k]["step"], w["per_round"])
    for p in live:
        p["time_ms"] = bench.stats(times[id(p)])
    for k, v in pyt.items():
        v["time_ms"] = bench.stats(ptimes[k])
    pyt_rows = [{"label": k, "loss": v["loss"], "peak": v["peak"], "time_ms": v["time_ms"]}
                for k, v in pyt.items()]
    del pyt
    handles = proc.ask("teardown")["live_handles"]
    row = {"workload": w["name"], "model": w["name"], "what": w["what"], "params": w["params"], "binds": w["binds"],
           "loss": w["loss"], "random": w["random"], "plans": plans, "pytorch": pyt_rows,
           "refused": plans_refused, "live_handles_after": handles,
           "seconds": time.time() - t_start}
    judge(row)
    for p in live:
        log("  %-15s ebb %-32s %8.1f ms  planned %10d  measured %10d" %
            (w["name"], p["label"], p["time_ms"]["median"], p["memory"]["planned"],
             p["memory"]["measured"]))
    for p in pyt_rows:
        log("  %-15s %-36s %8.1f ms  peak %10d" % (w["name"], p["label"], p["time_ms"]["median"],
                                                   p["peak"]))
    return row


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def judge(row):
    """Per plan: the checks (measured == planned, peak <= budget, losses);
    per workload: the issue's targets, 'ok' or 'MISSED: why'."""
    plans = [p for p in row["plans"] if "nofit" not in p]
    base = plans[0]
    tol = LOSS_TOL["random" if row["random"] else "deterministic"]
    pyt = {p["label"]: p for p in row["pytorch"]}
    for p in plans:
        m = p["memory"]
        c = {"measured_eq_planned": m["measured"] == m["planned"],
             "fits_budget": not p["budget"] or p["peak_bytes"] <= p["budget"],
             "loss_vs_pytorch": max(rel(a, b) for a, b in zip(p["loss"], pyt["PyTorch"]["loss"])),
             "loss_eq_none": p["loss"] == base["loss"]}
        c["ok"] = (c["measured_eq_planned"] and c["fits_budget"] and c["loss_vs_pytorch"] <= tol
                   and c["loss_eq_none"])
        p["check"] = c
        p["extra_flops_pct"] = 100.0 * p["recompute_flops"] / p["flops"] if p["flops"] else 0.0
        p["time_vs_none"] = p["time_ms"]["median"] / base["time_ms"]["median"]
        p["peak_cut"] = base["memory"]["measured"] / m["measured"] if m["measured"] else 0.0
    for p in row["pytorch"]:
        p["loss_vs_pytorch"] = max(rel(a, b) for a, b in zip(p["loss"], pyt["PyTorch"]["loss"]))
        p["ok"] = p["loss_vs_pytorch"] <= tol
        p["time_vs_none"] = p["time_ms"]["median"] / pyt["PyTorch"]["time_ms"]["median"]
    tg = {}
    tg["measured_eq_planned"] = ("ok" if all(p["check"]["measured_eq_planned"] for p in plans)
                                 else "MISSED: measured != planned at %s" % ", ".join(
                                     p["label"] for p in plans
                                     if not p["check"]["measured_eq_planned"]))
    checks_ok = all(p["check"]["ok"] for p in plans) and all(p["ok"] for p in row["pytorch"]) \
        and row["live_handles_after"] == 0
    tg["checks"] = "ok" if checks_ok else "FAILED"
    if row["workload"] == "residual_tower":
        # peak cut >= 4x for <= 35% more step time: the fastest plan that cuts 4x
        default = [p for p in plans if not p["after"]]
        cut4 = [p for p in default if p["peak_cut"] >= 4.0]
        if not cut4:
            tg["cut_4x_within_35pct"] = "MISSED: no plan cuts the peak 4x"
        else:
            best = min(cut4, key=lambda p: p["time_vs_none"])
            tg["cut_4x_within_35pct"] = (
                "ok" if best["time_vs_none"] <= 1.35 else
                "MISSED: the fastest 4x cut (%s, %.1fx) takes %.2fx the step time"
                % (best["label"], best["peak_cut"], best["time_vs_none"]))
            row["cut4_plan"] = best["label"]
    # equal budget: ebb at PyTorch-with-checkpoint's peak against PyTorch with checkpoint
    pc = pyt["PyTorch ckpt"]["time_ms"]["median"]
    for label, key in (("= PyT ckpt peak", "equal_budget_faster"),
                       ("= PyT ckpt peak, updates after", "equal_budget_faster_updates_after")):
        p = [q for q in row["plans"] if label in (q["label"], q.get("also"))]
        if not p or "nofit" in p[0]:
            tg[key] = "MISSED: ebb cannot fit PyTorch-with-checkpoint's peak"
            continue
        r = p[0]["time_ms"]["median"] / pc
        p[0]["time_vs_pyt_ckpt"] = r
        tg[key] = "ok" if r < 1.0 else "MISSED: ebb/PyTorch ckpt = %.3f" % r
    row["targets"] = tg


def fmt_b(b):
    return "%d (%.2f MiB)" % (b, b / MIB)


def table(rows):
    head = ["workload", "engine", "budget", "planned B", "measured B", "m=p", "peak cut",
            "step ms med [min, max]", "vs none", "extra FLOPs", "recomputed steps / seg",
            "compile ms", "check"]
    body = []
    for r in rows:
        for p in r["plans"]:
            eng = "ebb" + (" (updates after backward)" if p["after"] else "")
            bud = "none" if not p["budget"] else "%s = %s" % (
                p["label"].replace(", updates after", ""), fmt_b(p["budget"]))
            if p["label"].startswith("none"):
                bud = "none"
            if p.get("also"):
                bud += ", also at PyT ckpt's peak"
            if "nofit" in p:
                body.append([r["workload"], eng, bud, "cannot fit: " + p["nofit"]] +
                            [""] * (len(head) - 4))
                continue
            m, c = p["memory"], p["check"]
            body.append([r["workload"], eng, bud, str(m["planned"]), str(m["measured"]),
                         "ok" if c["measured_eq_planned"] else "MISS",
                         "%.2fx" % p["peak_cut"], bench.fmt_t(p["time_ms"]),
                         "%.2f" % p["time_vs_none"], "%+.1f%%" % p["extra_flops_pct"],
                         "%d / %d" % (p["n_recompute_steps"], p["segment"]),
                         "-" if p["compile_ms"] is None else "%.0f" % p["compile_ms"],
                         "ok" if c["ok"] else "FAIL"])
        base = r["pytorch"][0]["peak"]
        for p in r["pytorch"]:
            body.append([r["workload"], p["label"], "-", "-", str(p["peak"]), "-",
                         "%.2fx" % (base / p["peak"]),
                         bench.fmt_t(p["time_ms"]), "%.2f" % p["time_vs_none"], "-", "-", "-",
                         "ok" if p["ok"] else "FAIL"])
        if r.get("refused"):
            body.append([r["workload"], "ebb", "%s = %s" % (r["refused"]["label"], fmt_b(r["refused"]["budget"])),
                         "refused in %.0f ms: %s" % (r["refused"]["compile_ms"],
                                                     r["refused"]["message"].split(": ", 1)[-1])] +
                        [""] * (len(head) - 4))
    return head, body


LEGEND = ("peak cut: the same engine's peak without a budget (PyTorch: without "
          "checkpointing) over the row's. vs none: step time over "
          "the same engine's without a budget (PyTorch rows: over PyTorch without "
          "checkpointing). extra FLOPs: ebb's predicted recompute over the step's predicted "
          "FLOPs. m=p: measured == planned. check: the first two steps' losses agree (ebb's "
          "plans bit for bit with each other, PyTorch's within 1e-3, 1e-2 with dropout), the "
          "plan's peak fits its budget, no handle leaked.")


def render(rows):
    """Text table, as run.py's render_text, with refusals on their own line."""
    head, body = table(rows)
    keep = [b for b in body if not str(b[3]).startswith(("cannot", "refused"))]
    w = [max(len(str(x[i])) for x in [head] + keep) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w[i]) if i < 3 else str(c).rjust(w[i])
                       for i, c in enumerate(head)), "  ".join("-" * x for x in w)]
    for b in body:
        if str(b[3]).startswith(("cannot", "refused")):
            lines.append("  ".join(str(c) for c in b[:4]))
        else:
            lines.append("  ".join(str(c).ljust(w[i]) if i < 3 else str(c).rjust(w[i])
                                   for i, c in enumerate(b)))
    if rows and rows[0].get("malloc"):
        lines.append("glibc malloc: %s (see tests/bench/remat.py)" % rows[0]["malloc"])
    return "\n".join(lines)


MALLOC_PIN = {"MALLOC_MMAP_THRESHOLD_": 32 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 30}


def pin_malloc(env):
    """glibc's thresholds pinned for ebb's process (env) and this one
    (mallopt), unless EBB_BENCH_MALLOC=default. Returns what was done."""
    if os.environ.get("EBB_BENCH_MALLOC") == "default":
        return "glibc defaults"
    for k, v in MALLOC_PIN.items():
        env[k] = str(v)
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (libc.mallopt(m_mmap_threshold, MALLOC_PIN["MALLOC_MMAP_THRESHOLD_"]) and
            libc.mallopt(m_trim_threshold, MALLOC_PIN["MALLOC_TRIM_THRESHOLD_"])):
        raise RuntimeError("mallopt refused the thresholds")
    return "pinned: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB"


def run_all(build, out_dir, log, only=None):
    binary = os.path.join(build, "tests", "bench", "ebb_remat_bench")
    if not os.path.exists(binary):
        raise RuntimeError("%s not found (configure with -DEBB_BUILD_BENCH=ON)" % binary)
    env = dict(os.environ)
    malloc = pin_malloc(env)
    log("  remat: glibc malloc %s" % malloc)
    proc = RematProc(binary, env)
    rows = []
    try:
        for w in WORKLOADS:
            if only and w["name"] not in only and "remat" not in only:
                continue
            log("  remat: %s (%s)" % (w["name"], w["what"]))
            rows.append(run_workload(proc, w, out_dir, log))
            rows[-1]["malloc"] = malloc
    finally:
        proc.close()
    return rows
