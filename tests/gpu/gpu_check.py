#!/usr/bin/env python3
"""Helpers of tests/gpu/run.sh (`make gpu-check`), standard library only, so
that any python3 runs them:

  suite RUN_PY                  the bench workloads and sizes of tests/bench/run.py
                                (its SUITE), one tab-separated line each:
                                workload, config, params, binds, fills
  fill IN OUT NAME=VALUE...     copies a safetensors file, setting float32
                                tensors to VALUE (the bench's parameter fills)
  dataset PLAN_JSON OUT ROWS    a safetensors file of ROWS samples for every
                                input and target of an `ebb plan --train --json`
  peak TRACE LABEL CONFIG       one `peak` line of the summary from a JSONL
                                trace (`ebb run/grad/train --trace`)
  train ROWS RUN_PY MISSING     one `train` line of the summary per training
                                row of RUN_PY's SUITE, from ROWS (the JSON
                                lines of `run.py --train-rows`); MISSING is
                                the cell of a row ROWS lacks ("n/a (why)" or
                                "FAIL (why)")
  losses LABEL CONFIG EAGER GRAPH
                                one `peak` line: the per-step losses of two
                                `ebb train --json --log-every 1` logs (eager
                                and --cuda-graph) agree within 1e-5
  table SUMMARY                 the table run.sh prints last
"""
import ast
import json
import os
import random
import struct
import sys


def fail(msg):
    sys.exit("gpu_check.py: " + msg)


# ---- suite -----------------------------------------------------------------

def suite_rows(run_py):
    """tests/bench/run.py's SUITE, read as a literal (importing run.py would
    need numpy and torch)."""
    with open(run_py) as f:
        tree = ast.parse(f.read(), run_py)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "SUITE" for t in node.targets):
            return ast.literal_eval(node.value)
    fail("%s has no SUITE list" % run_py)


def suite(run_py):
    rows = suite_rows(run_py)
    csv = lambda d: ",".join("%s=%s" % kv for kv in d.items()) or "-"  # noqa: E731
    for workload, config, params, binds, fills in rows:
        print("\t".join([workload, config, csv(params), csv(binds), fills or "-"]))


# ---- safetensors -----------------------------------------------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    return header, bytearray(raw[8 + n:])


def write_safetensors(path, header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    os.replace(path + ".tmp", path)


def fill(src, dst, assignments):
    header, data = read_safetensors(src)
    for a in assignments:
        name, _, value = a.partition("=")
        t = header.get(name)
        if not t:
            fail("%s: no tensor '%s' to fill" % (src, name))
        if t["dtype"] != "F32":
            fail("%s: '%s' is %s, only F32 can be filled" % (src, name, t["dtype"]))
        lo, hi = t["data_offsets"]
        data[lo:hi] = struct.pack("<f", float(value)) * ((hi - lo) // 4)
    write_safetensors(dst, header, bytes(data))


def dataset(plan_json, out, rows):
    """Standard normal floats; integer targets (class indices) in [0, 10)."""
    with open(plan_json) as f:
        plan = json.load(f)
    rng = random.Random(1)
    header, chunks, offset = {}, [], 0
    for v in plan["inputs"]:
        shape = [rows] + v["shape"][1:]
        n = 1
        for d in shape:
            n *= d
        if v["dtype"] == "float32":
            blob, dt = struct.pack("<%df" % n, *(rng.gauss(0, 1) for _ in range(n))), "F32"
        elif v["dtype"] == "int64":
            blob, dt = struct.pack("<%dq" % n, *(rng.randrange(10) for _ in range(n))), "I64"
        else:
            fail("%s: input '%s' is %s; only float32 and int64 are made"
                 % (plan_json, v["name"], v["dtype"]))
        header[v["name"]] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    write_safetensors(out, header, b"".join(chunks))


# ---- peaks -----------------------------------------------------------------

def peak(trace, label, config):
    """planned (the summary's, rounded as the device's allocator rounds),
    measured (the summary's: the run's peak above its start), the plan's kind
    and a verdict; for a run that measured more than planned, the step whose
    measured peak exceeds its planned figure the most (a step's planned
    figure in the trace is the CPU count, so a few 512-byte roundings of
    difference there are expected on CUDA)."""
    steps, summary = [], None
    try:
        with open(trace) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                rec = json.loads(line)
                if "summary" in rec:
                    summary = rec["summary"]
                else:
                    steps.append(rec)
    except (OSError, ValueError) as e:
        print("\t".join(["peak", label, config, "-", "-", "-", "FAIL", "no trace: %s" % e]))
        return
    if not summary:
        print("\t".join(["peak", label, config, "-", "-", "-", "FAIL",
                         "the trace has no summary line (the run failed)"]))
        return
    planned, measured = summary["planned_peak_bytes"], summary["peak_bytes"]
    kind = summary.get("peak_kind", "?")
    note = ""
    if measured > planned:
        verdict = "FAIL over"
        worst = max(steps, key=lambda s: s["peak_bytes"] - s["planned_peak_bytes"], default=None)
        if worst:
            note = "step %d (%s, %s) measured %+d bytes against its planned %d" % (
                worst["step"], worst["op"], worst["node"],
                worst["peak_bytes"] - worst["planned_peak_bytes"], worst["planned_peak_bytes"])
    elif measured == planned:
        verdict = "ok"
    elif kind == "bound":
        verdict = "ok (%.0f%% of the bound)" % (100.0 * measured / planned)
    else:
        verdict = "DIFF under"
        note = "an exact plan promised %d bytes more than the run took" % (planned - measured)
    if summary.get("live_tensors_after"):
        note = "; ".join(([note] if note else []) +
                         ["%d tensor handles leaked" % summary["live_tensors_after"]])
    print("\t".join(["peak", label, config, str(planned), str(measured), kind, verdict, note]))


def step_losses(log):
    """(step, loss) of each `{"type": "step", ...}` line of an `ebb train
    --json` log."""
    out = []
    with open(log) as f:
        for line in f:
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") == "step":
                    out.append((rec["step"], rec["loss"]))
    return out


def losses(label, config, eager_log, graph_log):
    """One `peak`-shaped line: whether the training run replayed from a CUDA
    graph (ebb train --cuda-graph) logged the eager run's losses, step for
    step, within 1e-5 relative (the optimizer's multiply-adds may round
    otherwise in the graph)."""
    try:
        a, b = step_losses(eager_log), step_losses(graph_log)
    except OSError as e:
        print("\t".join(["peak", label, config, "-", "-", "-", "FAIL", "no log: %s" % e]))
        return
    if not a or [s for s, _ in a] != [s for s, _ in b]:
        print("\t".join(["peak", label, config, "-", "-", "-", "FAIL",
                         "steps logged: eager %s, graph %s" % ([s for s, _ in a],
                                                               [s for s, _ in b])]))
        return
    worst = max(abs(x - y) / max(abs(x), 1e-12) for (_, x), (_, y) in zip(a, b))
    verdict = "ok" if worst <= 1e-5 else "FAIL losses"
    print("\t".join(["peak", label, config, "-", "-", "-", verdict,
                     "%d steps, losses within %.1e of the eager run's" % (len(a), worst)]))


# ---- train -----------------------------------------------------------------

def clean(text, n=160):
    return " ".join(str(text).split())[:n]


def train_line(r):
    """The summary's fields after `train WORKLOAD CONFIG` for one row of
    run.py's train_rows: ebb, C++ twin and PyTorch eager medians (ms),
    ebb/PyTorch, the time target's verdict, ebb's planned and measured peak,
    PyTorch's and the twin's peak (bytes), the check (losses agree, no
    handle leaked, measured within planned) and a note."""
    if "skipped" in r:
        return ["n/a (skipped: %s)" % clean(r["skipped"], 120)] + ["-"] * 9 + ["", "-", "-"]
    if "failed" in r:
        return ["FAIL (%s)" % clean(r["failed"], 160)] + ["-"] * 9 + ["", "-", "-"]
    tm, m, tg, c = r["time_ms"], r["memory"], r["targets"], r["check"]
    med = lambda k: "%.3f" % tm[k]["median"] if k in tm else "-"  # noqa: E731
    ratio_pyt = "%.3f" % r["ratio_ebb_pytorch"]
    verdict = tg.get("time_vs_pytorch") or "-"
    if verdict.startswith("MISSED"):
        verdict = "MISSED"
    planned, measured = m.get("ebb_planned"), m.get("ebb_measured")
    checks, notes = [], []
    if tg.get("same_losses") != "ok":
        checks.append("FAIL losses")
        notes.append("losses: ebb %s, C++ %s, PyTorch %s" % (
            c.get("ebb_loss"), c.get("cxx_loss"), c.get("pytorch_loss")))
    if c.get("live_handles_after"):
        notes.append("%d ebb tensor handles leaked" % c["live_handles_after"])
    if planned is not None and measured is not None and measured > planned:
        checks.append("FAIL over")
        notes.append("ebb measured %+d bytes against its plan (at %s)" % (
            measured - planned, m.get("ebb_peak_at", "?")))
    if c.get("random"):
        notes.append(c["random"])
    # the step replayed from a CUDA graph, and its verdict against the target
    graph, graph_ratio = med("graph"), "-"
    if "ratio_graph_pytorch" in r:
        graph_ratio = "%.3f" % r["ratio_graph_pytorch"]
        verdict = tg.get("graph_vs_pytorch") or verdict
        verdict = "MISSED" if verdict.startswith("MISSED") else verdict
    elif r.get("graph_why"):
        graph = "n/a (%s)" % clean(r["graph_why"], 100)
    return [med("ebb"), med("cxx"), med("pytorch"), ratio_pyt, verdict,
            str(planned), str(measured), str(m.get("pytorch_peak", "-")),
            str(m.get("cxx_peak", "-")), ", ".join(checks) or "ok", "; ".join(notes),
            graph, graph_ratio]


def train(rows_path, run_py, missing):
    done = {}
    try:
        with open(rows_path) as f:
            lines = f.readlines()
    except OSError:  # run.py stopped before its first row: every row is missing
        lines = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:  # blank, or the last line cut short by a timeout
            continue
        done[(r["workload"], r["config"])] = r
    for workload, config, _params, _binds, _fills in suite_rows(run_py):
        r = done.get((workload, config))
        fields = train_line(r) if r else [missing] + ["-"] * 9 + ["", "-", "-"]
        print("\t".join(["train", workload, config] + [f.replace("\t", " ") for f in fields]))


# ---- table -----------------------------------------------------------------

def render(head, rows):
    w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(head)).rstrip(),
           "  ".join("-" * x for x in w)]
    for r in rows:
        out.append("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return "\n".join(out)


def ratio(a, b):
    try:
        return "%.2f" % (float(a) / float(b))
    except (ValueError, ZeroDivisionError):
        return "-"


def noted(text, notes):
    """"n/a (why)" and "FAIL (why)" become "n/a [k]", the why added to notes
    (printed below the table as [k])."""
    for word in ("n/a", "FAIL"):
        if text.startswith(word + " ("):
            why = text[len(word) + 2:-1]
            if why not in notes:
                notes.append(why)
            return "%s [%d]" % (word, notes.index(why) + 1)
    return text


def table(path):
    lines = []
    with open(path) as f:
        for line in f:
            if line.strip():
                lines.append(line.rstrip("\n").split("\t"))
    info = [l[1] for l in lines if l[0] == "info"]
    steps = [l[1:] for l in lines if l[0] == "step"]
    peaks = [l[1:] for l in lines if l[0] == "peak"]
    times = [l[1:] for l in lines if l[0] == "time"]
    trains = [l[1:] for l in lines if l[0] == "train"]
    pyt = {(l[1], l[2]): l[3:] for l in lines if l[0] == "pytorch"}
    for i in info:
        print(i)
    if steps:
        print()
        print(render(["step", "result", "details"], steps))
    if peaks:
        print()
        print("peak intermediate bytes: planned (rounded to the caching allocator's 512-byte "
              "blocks) against measured")
        print(render(["spec", "config", "planned B", "measured B", "kind", "verdict", "note"],
                     peaks))
    if times:
        print()
        print("forward times in ms (median): ebb eager, ebb CUDA-graph replay, the libtorch C++ "
              "twin, PyTorch eager, torch.compile(mode=\"reduce-overhead\")")
        rows, notes = [], []

        def cell(text):
            return noted(text, notes)
        for workload, config, eager, replay, twin in times:
            p = pyt.get((workload, config),
                        ["n/a (no PyTorch result: out of time or failed, see bench/pytorch.log)", "-"])
            comp = p[2] if len(p) > 2 else "-"
            rows.append([workload, config, cell(eager), cell(replay), cell(twin), cell(p[0]),
                         cell(comp), ratio(eager, replay), ratio(p[0], eager),
                         ratio(p[0], replay), ratio(comp, replay), p[1]])
        print(render(["workload", "config", "ebb eager", "ebb replay", "C++ twin",
                      "PyTorch eager", "torch.compile", "eager/replay", "PyTorch/eager",
                      "PyTorch/replay", "compile/replay", "PyTorch peak B"],
                     rows))
        for k, why in enumerate(notes):
            print("[%d] %s" % (k + 1, why))
    if trains:
        print()
        print("training steps (forward, loss, backward, AdamW lr 1e-3; tests/bench/run.py's rows) "
              "in ms (median), each step between two device synchronisations: ebb, ebb's step "
              "replayed from a CUDA graph (ebb_train_capture), the libtorch C++ twin, PyTorch "
              "eager; target (the graph's where there is one, else eager's) ebb/PyTorch <= 0.85 "
              "on dispatch-bound rows, <= 1 on compute-bound ones; peaks in bytes above parameters, optimizer state, input "
              "and target")
        rows, notes = [], []

        def cell(text):
            return noted(text, notes)
        for t in trains:
            t = t + ["-"] * (15 - len(t))
            (w, c, ebb, cxx, pyt, rat, verdict, planned, measured, ppeak, cpeak, check, note,
             graph, grat) = t[:15]
            if note:
                if note not in notes:
                    notes.append(note)
                check = "%s [%d]" % (check, notes.index(note) + 1)
            rows.append([w, c, cell(ebb), cell(graph), cell(cxx), cell(pyt), rat, grat, verdict,
                         ratio(ebb, cxx), planned, measured, ppeak, cpeak, check])
        print(render(["workload", "config", "ebb ms", "ebb graph ms", "C++ twin ms",
                      "PyTorch ms", "ebb/PyTorch", "graph/PyTorch", "target", "ebb/C++",
                      "ebb planned B", "ebb measured B", "PyTorch B", "C++ twin B", "check"],
                     rows))
        for k, why in enumerate(notes):
            print("[%d] %s" % (k + 1, why))


def main(argv):
    if len(argv) < 2:
        fail("usage: gpu_check.py suite|fill|dataset|peak|train|table ARGS (see the top of the "
             "file)")
    cmd, args = argv[1], argv[2:]
    if cmd == "suite" and len(args) == 1:
        suite(args[0])
    elif cmd == "fill" and len(args) >= 2:
        fill(args[0], args[1], args[2:])
    elif cmd == "dataset" and len(args) == 3:
        dataset(args[0], args[1], int(args[2]))
    elif cmd == "peak" and len(args) == 3:
        peak(*args)
    elif cmd == "losses" and len(args) == 4:
        losses(*args)
    elif cmd == "train" and len(args) == 3:
        train(*args)
    elif cmd == "table" and len(args) == 1:
        table(args[0])
    else:
        fail("bad arguments: %s" % " ".join(argv[1:]))


if __name__ == "__main__":
    main(sys.argv)
