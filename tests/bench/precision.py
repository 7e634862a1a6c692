"""Mixed-precision training rows (issue 29): the training step of the
bench's workloads in bfloat16 against float32, ebb against PyTorch eager,
side by side in one run. Per workload:

- ebb in fp32 and in bf16 (ebb_compile_options.precision = EBB_PRECISION_BF16,
  torch.autocast's policy: linear, matmul, convolution and attention in
  bfloat16 on low copies of their inputs and parameters; the norms, softmax
  and the loss in float32; parameters and AdamW state float32), each with its
  own model and AdamW from the same seed, so both start from the same
  weights, input and target (the check compares their exports);
- PyTorch eager in fp32 and under torch.autocast(device_type="cpu",
  dtype=torch.bfloat16) around the forward and the loss, the backward and
  opt.step() outside it, as PyTorch's AMP recipe has it (no GradScaler for
  bfloat16), each with its own AdamW from ebb's initial values.

Reported for each precision: ebb's planned peak and its measured one
(ebb_run_stats), PyTorch's measured peak (the profiler's allocation events
around one step: run.py's torch_train_peak), the step time of each, and what
ebb's forward keeps for the backward: the bytes of the values made in the
forward (or the loss) that a backward step reads, from the public plan API
(bench_precision.c; `ebb plan`'s listing calls them the values that "cross
from the forward into the backward"). That is the part of the peak that
precision halves, where the forward's kept values are the products' bf16
inputs; the gradients, the parameters' low copies and the fp32 values the
norms keep do not shrink. Ratios: ebb bf16 over ebb fp32 (peak, kept bytes,
time), PyTorch autocast over PyTorch fp32, and ebb over PyTorch at each
precision.

Timing: ebb's process (`ebb_bench precision`) and this one take turns by
rounds, the first side and the order within each alternating, with every
engine at the same intra-op thread count; the first CHECK_STEPS steps of
each (their losses compared) and the measured one come before. On a CPU
without bfloat16 arithmetic (avx512_bf16, AMX) oneDNN's bf16 kernels are
slower than fp32 ones; the table says so in its numbers either way.

Run through run.py (`bash tests/bench/run.sh BUILD --only precision`), which
sets the threads before torch loads.
"""
import os

import torch

import run as bench  # Ebb, SUITE, TRAIN_LOSS, load_export, torch_train_twin, rendering

# (workload, config) of run.py's SUITE: its sizes, binds and fills
ROWS = [("transformer", "compute"), ("convnet", "compute"), ("gpt", "compute"),
        ("mlp", "compute")]
PRECISIONS = ["fp32", "bf16"]
AMP = {"fp32": None, "bf16": torch.bfloat16}
CHECK_STEPS = 2
# the checked steps and the measured ones warm up (as run.py's compute-bound
# training rows); then 4 timed steps of each engine
TIMING = {"warmup": 0, "rounds": 4, "per_round": 1}
# the first steps' losses, ebb against PyTorch at the same precision
# (relative): fp32 as run.py's training rows; bf16 rounds each product's
# inputs to 8 significant bits, in its own order on each side; dropout draws
# its own masks on each side
LOSS_TOL = {"fp32": 1e-3, "bf16": 2e-2}
LOSS_TOL_RANDOM = {"fp32": 1e-2, "bf16": 5e-2}
# the issue's claim, checked where it is made: the activations the forward
# keeps for the backward fall to about half in bf16
KEPT_HALF = {"transformer": 0.6, "convnet": 0.6}


def suite_entry(workload, config):
    for w, c, params, binds, fills in bench.SUITE:
        if (w, c) == (workload, config):
            return params, binds, fills
    raise KeyError("%s/%s is not in run.py's SUITE" % (workload, config))


def norms_in_fp32(model):
    """Makes the module's LayerNorms take float32 inputs, as CUDA autocast's
    policy (and ebb's) runs layer_norm: PyTorch 1.13's CPU autocast has no
    rule for it, and its layer_norm kernel refuses a bfloat16 input with
    float32 weights. False when the module has none."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    for m in norms:
        m.register_forward_pre_hook(lambda m, args: tuple(a.float() for a in args))
    return bool(norms)


def storage_of(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def low_dtype(dtype):
    return dtype in (torch.bfloat16, torch.float16)


def torch_kept(model, step):
    """What PyTorch's autograd keeps for the backward in one step: the
    storages of the tensors the forward saves (saved_tensors_hooks), each
    counted once, less the parameters', buffers', input's and target's. Under
    autocast that includes the bfloat16 copies of the weights its cache
    makes for the step. By dtype, as the ebb side's."""
    skip = {storage_of(t).data_ptr()
            for t in list(model.parameters()) + list(model.buffers()) + list(step.held)}
    saved = {}

    def pack(t):
        try:
            st = storage_of(t)
            if st.data_ptr() not in skip:
                saved[st.data_ptr()] = (st.nbytes(), t.dtype)
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            pass
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    out = {"bytes": 0, "float32": 0, "low": 0, "other": 0, "values": len(saved)}
    for n, dtype in saved.values():
        out["bytes"] += n
        out["float32" if dtype == torch.float32 else "low" if low_dtype(dtype) else "other"] += n
    return out


def same_exports(a, b):
    """Whether two exports hold the same names, shapes and values."""
    ta, tb = bench.load_export(a), bench.load_export(b)
    return len(ta) == len(tb) and all(
        na == nb and tuple(va.shape) == tuple(vb.shape) and bool(torch.equal(va, vb))
        for (na, va), (nb, vb) in zip(ta, tb))


def run_row(ebb, out_dir, workload, config, clock, log):
    params, binds, fills = suite_entry(workload, config)
    spec = os.path.join(bench.ROOT, "specs", "bench", workload + ".yaml")
    loss = bench.TRAIN_LOSS[workload]
    base = {"workload": workload, "config": config, "params": params, "binds": binds,
            "loss": loss}
    prefix = {p: os.path.join(out_dir, "precision_%s_%s_%s" % (workload, config, p))
              for p in PRECISIONS}
    e = {}
    try:
        for p in PRECISIONS:
            e[p] = ebb.ask("setup", p, workload, spec, prefix[p], bench.csv(params),
                           bench.csv(binds), fills or "-", loss, CHECK_STEPS)
            if "skipped" in e[p]:
                why = e[p]["skipped"].split("error: ", 1)[-1].split(";")[0]
                log("  precision %-12s %-8s skipped (%s): %s" % (workload, config, p, why))
                ebb.ask("teardown")
                return dict(base, skipped="%s: %s" % (p, why))
    except RuntimeError as err:  # an ebb error: reported in the table, the rest still runs
        log("  precision %-12s %-8s FAILED: %s" % (workload, config, err))
        ebb.ask("teardown")
        return dict(base, failed=str(err), targets={"runs": "FAILED: %s" % err})
    try:
        same_start = same_exports(prefix["fp32"], prefix["bf16"])
        t, wall, cpu = measure_and_time(ebb, e, workload, config, params, prefix["fp32"], loss,
                                        log)
    except Exception as err:  # PyTorch's side or an ebb step: this row's FAILED
        why = "%s: %s" % (type(err).__name__, str(err).split("\n")[0])
        log("  precision %-12s %-8s FAILED: %s" % (workload, config, why))
        ebb.ask("teardown")
        return dict(base, failed=why, targets={"runs": "FAILED: %s" % why})
    live = ebb.ask("teardown")["live_handles"]

    row = dict(base, ebb={}, pytorch={}, clock=clock)
    for p in PRECISIONS:
        row["ebb"][p] = dict(e[p], time_ms_wall=bench.stats(wall["ebb", p]),
                             time_ms_cpu=bench.stats(cpu["ebb", p]))
        row["pytorch"][p] = {"peak": t[p]["peak"], "loss": t[p]["loss"],
                             "autocast": str(AMP[p]) if AMP[p] is not None else None,
                             "note": t[p]["note"], "kept": t[p]["kept"],
                             "time_ms_wall": bench.stats(wall["pytorch", p]),
                             "time_ms_cpu": bench.stats(cpu["pytorch", p])}
        for side in ("ebb", "pytorch"):
            row[side][p]["time_ms"] = row[side][p]["time_ms_" + clock]
    row["ratios"] = ratios(row)
    random = bench.TRAIN_RANDOM.get(workload)
    tol = LOSS_TOL_RANDOM if random else LOSS_TOL
    row["check"] = {"same_start": same_start, "live_handles_after": live, "random": random,
                    "loss_rel_diff": {p: bench.rel_diff(row["ebb"][p]["loss"],
                                                        row["pytorch"][p]["loss"])
                                      for p in PRECISIONS},
                    "loss_tol": tol}
    row["targets"] = judge(row)
    rt = row["ratios"]
    for p in PRECISIONS:
        ep, tp = row["ebb"][p], row["pytorch"][p]
        log("  precision %-12s %-8s %s: ebb %7.1f ms, planned %d B, measured %d B, kept %s; "
            "PyTorch%s %7.1f ms, %d B, kept %s"
            % (workload, config, p, ep["time_ms"]["median"], ep["planned_peak"], ep["measured"],
               fmt_kept(ep["kept_bytes"], ep["kept_float32"], ep["kept_low"], ep["kept_other"]),
               " autocast" if AMP[p] is not None else "", tp["time_ms"]["median"], tp["peak"],
               fmt_kept(tp["kept"]["bytes"], tp["kept"]["float32"], tp["kept"]["low"],
                        tp["kept"]["other"])))
    log("  precision %-12s %-8s bf16/fp32: ebb peak %.3f, kept %.3f, time %.3f; PyTorch peak "
        "%.3f, kept %.3f, time %.3f" % (workload, config, rt["ebb_peak"], rt["ebb_kept"],
                                        rt["ebb_time"], rt["pytorch_peak"], rt["pytorch_kept"],
                                        rt["pytorch_time"]))
    return row


def measure_and_time(ebb, e, workload, config, params, prefix, loss, log):
    """PyTorch's twins from ebb's initial values (the export at prefix), in
    fp32 and under autocast, their first losses, every engine's peak and
    PyTorch's kept bytes (e[p] gets ebb's measure), then the timed rounds;
    returns PyTorch's side, and the wall-clock and thread CPU ms by (engine,
    precision)."""
    t = {}
    for p in PRECISIONS:
        model, opt, step = bench.torch_train_twin(workload, params, prefix, loss, amp=AMP[p])
        t[p] = {"model": model, "opt": opt, "step": step, "note": None}
        try:
            first = float(step().item())
        except RuntimeError as err:
            if AMP[p] is None or not norms_in_fp32(model):
                raise
            # the forward failed before the backward: nothing was updated
            t[p]["note"] = ("layer_norm in float32 (PyTorch %s's CPU autocast: %s)"
                            % (torch.__version__, str(err).split("\n")[0]))
            log("  precision %-12s %-8s PyTorch autocast: %s" % (workload, config,
                                                                  t[p]["note"]))
            first = float(step().item())
        t[p]["loss"] = [first] + [float(step().item()) for _ in range(CHECK_STEPS - 1)]
    for p in PRECISIONS:
        e[p].update(ebb.ask("measure", p))
        t[p]["peak"] = bench.torch_train_peak(t[p]["opt"], t[p]["step"])
        t[p]["kept"] = torch_kept(t[p]["model"], t[p]["step"])

    for p in PRECISIONS:
        ebb.ask("round", p, TIMING["warmup"])
        bench.torch_train_round(t[p]["step"], TIMING["warmup"])
    wall = {(s, p): [] for s in ("ebb", "pytorch") for p in PRECISIONS}
    cpu = {k: [] for k in wall}
    for r in range(TIMING["rounds"]):
        precs = PRECISIONS if r % 4 < 2 else PRECISIONS[::-1]
        for side in (["ebb", "pytorch"] if r % 2 == 0 else ["pytorch", "ebb"]):
            for p in precs:
                if side == "ebb":
                    res = ebb.ask("round", p, TIMING["per_round"])
                    wall["ebb", p] += res["wall"]
                    cpu["ebb", p] += res["cpu"]
                else:
                    wall["pytorch", p] += bench.torch_train_round(
                        t[p]["step"], TIMING["per_round"], cpu=cpu["pytorch", p])
    return t, wall, cpu


def fmt_kept(total, f32, low, other):
    return "%d B (fp32 %d, bf16/fp16 %d, other %d)" % (total, f32, low, other)


def ratios(row):
    e, t = row["ebb"], row["pytorch"]

    def med(s):
        return s["time_ms"]["median"]
    r = {"ebb_peak": e["bf16"]["measured"] / e["fp32"]["measured"],
         "ebb_planned": e["bf16"]["planned_peak"] / e["fp32"]["planned_peak"],
         "ebb_kept": e["bf16"]["kept_bytes"] / e["fp32"]["kept_bytes"],
         "pytorch_kept": t["bf16"]["kept"]["bytes"] / t["fp32"]["kept"]["bytes"],
         "ebb_time": med(e["bf16"]) / med(e["fp32"]),
         "pytorch_peak": t["bf16"]["peak"] / t["fp32"]["peak"],
         "pytorch_time": med(t["bf16"]) / med(t["fp32"])}
    for p in PRECISIONS:
        r["ebb_pytorch_peak_" + p] = e[p]["measured"] / t[p]["peak"]
        r["ebb_pytorch_time_" + p] = med(e[p]) / med(t[p])
    return r


def judge(row):
    """'ok', 'MISSED: why' or 'FAILED' per target; None where one does not
    apply."""
    e, t, c, tg = row["ebb"], row["pytorch"], row["check"], {}
    over = ["%s measured %d > planned %d" % (p, e[p]["measured"], e[p]["planned_peak"])
            for p in PRECISIONS if e[p]["measured"] > e[p]["planned_peak"]]
    tg["measured_le_planned"] = "ok" if not over else "MISSED: " + "; ".join(over)
    tg["bf16_peak_le_autocast"] = (
        "ok" if e["bf16"]["measured"] <= t["bf16"]["peak"] else
        "MISSED: ebb bf16 %d > PyTorch autocast %d" % (e["bf16"]["measured"], t["bf16"]["peak"]))
    lim = KEPT_HALF.get(row["workload"])
    if lim is not None:
        r = row["ratios"]["ebb_kept"]
        tg["kept_halves"] = ("ok" if r <= lim else
                             "MISSED: kept for the backward bf16/fp32 = %.3f > %.2f" % (r, lim))
    same = (c["same_start"] and c["live_handles_after"] == 0 and
            all(c["loss_rel_diff"][p] <= c["loss_tol"][p] for p in PRECISIONS))
    tg["same_model"] = "ok" if same else "FAILED"
    return tg


def run_all(build, out_dir, log, clock="wall"):
    ebb = bench.start_side(build, "ebb_bench", ["precision"])
    rows = []
    try:
        for workload, config in ROWS:
            missing = [op for op in bench.NEEDS.get(workload, [])
                       if not bench.ebb_has_op(ebb, op)]
            if missing:
                rows.append({"workload": workload, "config": config,
                             "skipped": "ebb has no op " + ", ".join(missing)})
                continue
            rows.append(run_row(ebb, out_dir, workload, config, clock, log))
    finally:
        ebb.close()
    return rows


def table(rows):
    head = ["workload", "config", "precision", "ebb ms med [min, max]",
            "PyTorch ms med [min, max]", "ebb/PyT ms", "ebb planned B", "ebb measured B",
            "PyTorch B", "ebb/PyT B", "ebb kept B", "PyT kept B", "bf16/fp32: ebb B",
            "ebb kept", "ebb ms", "PyT B", "PyT kept", "PyT ms", "targets", "check"]
    body = []
    for r in rows:
        if "skipped" in r or "failed" in r:
            what = "skipped: " + r["skipped"] if "skipped" in r else "FAILED: " + r["failed"]
            body.append([r["workload"], r["config"], what] + [""] * (len(head) - 3))
            continue
        rt, tg = r["ratios"], r["targets"]
        misses = [k for k, v in tg.items() if k != "same_model" and v and v != "ok"]
        for p in PRECISIONS:
            e, t = r["ebb"][p], r["pytorch"][p]
            what = p
            if AMP[p] is not None:
                what += " (autocast, LN fp32)" if t["note"] else " (autocast)"
            line = [r["workload"], r["config"], what,
                    bench.fmt_t(e["time_ms"]), bench.fmt_t(t["time_ms"]),
                    "%.3f" % rt["ebb_pytorch_time_" + p], str(e["planned_peak"]),
                    str(e["measured"]), str(t["peak"]), "%.3f" % rt["ebb_pytorch_peak_" + p],
                    str(e["kept_bytes"]), str(t["kept"]["bytes"])]
            if p == "fp32":
                line += [""] * 6
            else:
                line += ["%.3f" % rt[k] for k in ("ebb_peak", "ebb_kept", "ebb_time",
                                                  "pytorch_peak", "pytorch_kept",
                                                  "pytorch_time")]
            line += ["ok" if not misses else "MISS: " + ", ".join(misses),
                     bench.short(tg["same_model"])]
            body.append(line)
    return head, body


def render(rows):
    return bench.render_text(*table(rows))


LEGEND = (
    "bf16: ebb with ebb_compile_options.precision = EBB_PRECISION_BF16; PyTorch eager with the "
    "forward and the loss under torch.autocast(device_type='cpu', dtype=torch.bfloat16), the "
    "backward and AdamW's step outside it; 'LN fp32': the LayerNorms' inputs cast to float32 "
    "first, as ebb and CUDA autocast run layer_norm, where this PyTorch's CPU autocast fails on "
    "them (1.13: a bfloat16 input with float32 weights). Peaks in bytes above the parameters, "
    "AdamW state, input and target (float32 at every precision): ebb's by its counting "
    "allocator, planned and measured, PyTorch's by the profiler's allocation events. kept: "
    "the bytes the forward keeps for the backward, each storage once: ebb's from its plan, "
    "PyTorch's from saved_tensors_hooks (with autocast's bf16 weight copies). bf16/fp32: the "
    "measured peak, kept bytes and step time in bf16 over fp32, ebb's then PyTorch's. targets: "
    "ebb measured <= planned; ebb bf16 <= PyTorch autocast; ebb kept bf16/fp32 <= %s (the "
    "issue's 'about half'). check: both ebb precisions start from the same export, the first "
    "%d losses agree with PyTorch's at the same precision (%g fp32, %g bf16 relative; %g and "
    "%g with dropout), no handle leaked"
    % (", ".join("%.2f %s" % (v, k) for k, v in KEPT_HALF.items()), CHECK_STEPS,
       LOSS_TOL["fp32"], LOSS_TOL["bf16"], LOSS_TOL_RANDOM["fp32"], LOSS_TOL_RANDOM["bf16"]))
