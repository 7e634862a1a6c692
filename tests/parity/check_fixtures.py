#!/usr/bin/env python3
"""Checks the committed PyTorch fixtures against the torch of the python that
runs this script (ctest's fixtures_match_torch runs it with EBB_TORCH_PYTHON).

    PYTHON tests/parity/check_fixtures.py [--work DIR] [--fixtures DIR]

The fixtures under fixtures/ were made with one torch (Debian's 1.13); ebb
may be built against another (pip's 2.x). This runs the four fixture
scripts with this python, twice, into DIR (default: a new temporary folder,
removed when the check passes; DIR/replay and DIR/fresh are emptied first;
nothing is written into the source tree):

  DIR/replay  with --replay fixtures/: the committed inputs, weights, targets,
              initial parameters and gradients, so that every output, loss,
              gradient and optimizer result is recomputed by this torch from
              exactly the committed inputs. This decides pass or fail.
  DIR/fresh   as the scripts run by default, from their seeds: whether this
              torch still draws the committed inputs and weights. Reported
              per fixture, not a failure: the tests read the committed inputs,
              so a different random stream only means that regenerating the
              fixtures with this torch would change them.

and compares every tensor of every regenerated file with the committed file
of the same name: the same files, tensor names, shapes, dtypes and header
metadata; inputs, weights, targets, options, step counts and integer tensors
bit for bit; every computed tensor by the measure and bound of the C test
that reads it (tests/parity/README.md explains them):

  M.expected: y                   max|a - b| / max(max|b|, 1e-6) <= 1e-5   (test_parity)
  grad_*: loss, grad.<p>          the same, <= 1e-5                          (test_train)
          grad.<p> in zero_grads  max|a - b| / (the file's largest |grad|) <= 1e-5
  grad_steps_*: <case>.loss.<t>   <= 1e-5;  <case>.final.<p>  <= 1e-6      (test_train)
                <case>_bf16: reported, not checked (bfloat16 autocast, below)
  grad_steps20_*: the same, adamw_bf16 reported, not checked; the elements a
                zero_grad.<p> mask marks are left
                out of final.<p> (their gradient is zero in exact arithmetic, so
                AdamW moves them by rounding noise; the script checks that they
                stay within AdamW's reach of their decayed initial values)
  optim_*: after.<t>.<p>          max|a - b| / max(max|b|, 1e-6) <= 1e-6   (test_train's
           optim.<p>.<slot>       max|a - b| / max|b| <= 1e-6               measure for steps)

A fixture that this torch reproduces within the bound its test allows ebb
is as good a reference for this torch as for the one that made it; one that
is further off could fail a correct ebb built against this torch. Two float32
implementations of the same computation differ by rounding (summation order,
vector width, fused multiply-add): the scripts report float32 within 1e-7 to
9e-7 of float64 for these models, so two correct torches land within about
1e-6 of each other, an order of magnitude inside the bounds of 1e-5 and
about at those of 1e-6 (the check prints how close).

test_optim's own measure is per element (|a - b| / max(|b|, 1e-2) for
parameters, / max(|b|, 1e-9 max|b|) for the state, <= 1e-6). It is printed
for the optimizer fixtures, but it does not decide pass or fail. Per element,
it tests the order of operations rather than the result: where a moment's
elements cancel to near zero, float32 rounding is large relative to them
(the committed adam_amsgrad exp_avg is itself 8e-6 per element from float64),
and ebb meets it only by doing torch 1.13's operations (mul_ and add_ for
exp_avg), which torch 2 replaced by lerp_.

One line per fixture gives the worst computed tensor (its deviation as a
fraction of its bound). On a mismatch the script names the file and tensor
and exits 1.
"""

import argparse
import json
import os
import runpy
import shutil
import struct
import subprocess
import sys
import tempfile
import threading

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
# make_grad_fixtures.py last: it turns on torch.use_deterministic_algorithms
SCRIPTS = ["make_optim_fixtures.py", "make_schedule_fixtures.py", "make_fixtures.py",
           "make_grad_fixtures.py"]
DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64}
OPTIM_SLOTS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg", "grad_avg",
               "acc_delta", "sum")

EXACT = ("exact",)
# The bfloat16 autocast cases' losses and parameters are reported against
# the committed ones, never checked: their rounding follows the CPU's kernels
# (AVX-512 or AVX2, oneDNN or ATen), so test_train compares ebb's bfloat16
# runs with a run of the same torch made on the machine at test time (ctest's
# reference_runs), not with these. The bound here only scales the report.
BF16_REPORT_BOUND = 1e-3


def bf16_case(fname, name):
    """Whether `name` of fixture `fname` is a bfloat16 autocast result."""
    return fname.startswith("grad_steps") and name.split(".")[0].endswith("_bf16")


def read(path):
    """({name: ndarray}, {name: dtype code}, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    arrays, codes = {}, {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        arrays[name] = np.frombuffer(blob[8 + n + lo : 8 + n + hi], dtype=DTYPES[h["dtype"]]).reshape(
            h["shape"])
        codes[name] = h["dtype"]
    return arrays, codes, meta


def criterion(fname, name, meta, committed):
    """How tensor `name` of fixture `fname` is compared: EXACT, or (measure,
    bound, scale) where measure is "max" (max|a-b| / scale; scale None:
    max(max|b|, 1e-6)) or "elem" (per element |a-b| / max(|b|, scale))."""
    b = committed[name]
    if not np.issubdtype(b.dtype, np.floating):
        return EXACT
    if fname.endswith(".expected.safetensors"):
        return ("max", 1e-5, None)
    if fname.startswith("grad_steps20_"):
        parts = name.split(".")
        loss_bound, final_bound = (BF16_REPORT_BOUND,) * 2 if bf16_case(fname, name) else (1e-5, 1e-6)
        if len(parts) >= 3 and parts[1] == "loss":
            return ("max", loss_bound, None)
        if len(parts) >= 3 and parts[1] == "final":
            mask = committed.get("zero_grad." + name.split(".", 2)[2])
            return ("max", final_bound, None) + ((mask != 0,) if mask is not None else ())
        return EXACT  # init.*, x.*, y.*, adamw.hp.*, zero_grad.*
    if fname.startswith("grad_steps_"):
        parts = name.split(".")
        low = bf16_case(fname, name)
        if len(parts) >= 3 and parts[1] == "loss":
            return ("max", BF16_REPORT_BOUND if low else 1e-5, None)
        if len(parts) >= 3 and parts[1] == "final":
            return ("max", BF16_REPORT_BOUND if low else 1e-6, None)
        return EXACT  # init.*, x.*, *.hp.*, *.clip.*
    if fname.startswith("grad_"):
        if name == "loss":
            return ("max", 1e-5, None)
        if name.startswith("grad."):
            zero = [z for z in meta.get("zero_grads", "").split(",") if z]
            if name[len("grad."):] in zero:
                top = max(np.abs(v.astype(np.float64)).max() for k, v in committed.items()
                          if k.startswith("grad."))
                return ("max", 1e-5, top)
            return ("max", 1e-5, None)
        return EXACT  # weights, x, y
    if fname == "lr_schedules.safetensors":
        return ("max", 1e-12, None)  # test_optim's bound for the rates
    if fname.startswith("optim_") and not fname.startswith("optim_mlp."):
        # test_train's measure for parameters after ten steps, and for the
        # state relative to its own largest value (exp_avg_sq of a 1e-7
        # gradient is 1e-16); test_optim's per element measure is reported
        # beside it (optim_info), see the docstring
        if name.startswith("after."):
            return ("max", 1e-6, None)
        if name.startswith("optim.") and name.rsplit(".", 1)[-1] in OPTIM_SLOTS:
            return ("max", 1e-6, np.abs(b.astype(np.float64)).max() or 1.0)
        return EXACT  # hp.*, optim.options, optim.<p>.step
    return EXACT  # *.weights, *.input, optim_mlp.params, optim_mlp.grads


def optim_info(name, b):
    """test_optim's own criterion for an optimizer tensor: per element
    |a - b| / max(|b|, floor), floor 1e-2 for parameters, 1e-9 of the
    tensor's largest value for the state, bound 1e-6."""
    floor = 1e-2 if name.startswith("after.") else 1e-9 * np.abs(b.astype(np.float64)).max()
    return ("elem", 1e-6, floor)


def deviation(a, b, how):
    a, b = a.astype(np.float64), b.astype(np.float64)
    if len(how) > 3:  # a mask of the elements to leave out
        a, b = a[~how[3]], b[~how[3]]
    if a.size == 0:
        return 0.0
    measure, _, scale = how[:3]
    if not np.all(np.isfinite(a)) or not np.all(np.isfinite(b)):
        return 0.0 if np.array_equal(a, b, equal_nan=True) else float("inf")
    d = np.abs(a - b)
    if measure == "max":
        return float(d.max() / (scale if scale is not None else max(np.abs(b).max(), 1e-6)))
    return float((d / np.maximum(np.abs(b), scale)).max()) if scale > 0 else float(
        0.0 if d.max() == 0 else np.inf)


def generate(out, replay):
    """Runs the four scripts in this process, one after the other, as
    `python SCRIPT --out OUT [--replay DIR]` would (importing torch once, not
    three times, saves seconds)."""
    for script in SCRIPTS:
        sys.argv = [os.path.join(HERE, script), "--out", out] + (["--replay", replay] if replay else [])
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                sys.exit(f"{script}: {e.code}")


def run_scripts(out, replay, logs):
    """Runs generate() in a child process of this python; logs gets
    (returncode, output)."""
    # one thread each: the two runs go side by side, as ctest runs the C tests
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--generate", out]
    if replay:
        cmd += ["--replay", replay]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs.append((p.returncode, p.stdout))


def compare(fname, new_dir, problems, fresh):
    """Compares new_dir/fname with the committed fixture, appending what does
    not match to problems. Returns a dict: "exact" and "computed" (how many
    tensors of each kind), "identical" (computed ones bit for bit the
    committed), "worst" (the computed tensor furthest off as (fraction of its
    bound, name, deviation, bound)), "per_elem" (the same by test_optim's
    per element measure, for an optimizer fixture) and, for the fresh run,
    "differ": the exact tensors that differ, [(name, max |a - b|)]."""
    committed, ccodes, cmeta = read(os.path.join(FIXTURES, fname))
    new, ncodes, nmeta = read(os.path.join(new_dir, fname))
    where = "seeded run" if fresh else "recomputed from the committed inputs"
    if nmeta != cmeta:
        keys = sorted(k for k in set(nmeta) | set(cmeta) if nmeta.get(k) != cmeta.get(k))
        problems.append(f"{fname}: metadata differs ({where}): "
                        + "; ".join(f"{k}: {nmeta.get(k)!r}, committed {cmeta.get(k)!r}" for k in keys))
    missing, extra = sorted(set(committed) - set(new)), sorted(set(new) - set(committed))
    if missing:
        problems.append(f"{fname}: this torch's script does not write {', '.join(missing)} ({where})")
    if extra:
        problems.append(f"{fname}: this torch's script writes {', '.join(extra)}, "
                        f"which the committed file lacks ({where})")
    r = {"exact": 0, "computed": 0, "identical": 0, "worst": None, "per_elem": None, "differ": [],
         "bf16": None}
    for name in sorted(set(committed) & set(new)):
        a, b = new[name], committed[name]
        if ncodes[name] != ccodes[name] or a.shape != b.shape:
            problems.append(f"{fname}: {name} is {ncodes[name]} {list(a.shape)}, committed "
                            f"{ccodes[name]} {list(b.shape)} ({where})")
            continue
        how = criterion(fname, name, cmeta, committed)
        if how == EXACT:
            r["exact"] += 1
            if a.tobytes() != b.tobytes():
                d = float(np.abs(a.astype(np.float64) - b).max()) if a.size else 0.0
                if fresh:
                    r["differ"].append((name, d))
                else:
                    problems.append(f"{fname}: {name} must be bit for bit the committed one, "
                                    f"differs by up to {d:.3g} ({where})")
            continue
        if bf16_case(fname, name):
            if not fresh:
                d = deviation(a, b, how)
                if r["bf16"] is None or not d <= r["bf16"][1]:
                    r["bf16"] = (name, d)
            continue
        r["computed"] += 1
        if fresh:
            continue  # the fresh run only answers whether the seeds draw the committed inputs
        r["identical"] += a.tobytes() == b.tobytes()
        d = deviation(a, b, how)
        if not d <= how[1]:
            problems.append(f"{fname}: {name} deviates by {d:.3g} > {how[1]:g} ({where})")
        if r["worst"] is None or not d / how[1] <= r["worst"][0]:
            r["worst"] = (d / how[1], name, d, how[1])
        if fname.startswith("optim_"):
            info = optim_info(name, b)
            d = deviation(a, b, info)
            if r["per_elem"] is None or not d / info[1] <= r["per_elem"][0]:
                r["per_elem"] = (d / info[1], name, d, info[1])
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="folder for the regenerated fixtures (emptied first)")
    ap.add_argument("--fixtures", help="the fixtures to check (default: fixtures/ here)")
    ap.add_argument("--generate", metavar="OUT", help=argparse.SUPPRESS)  # the child runs
    ap.add_argument("--replay", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        return generate(args.generate, args.replay)
    import torch  # noqa: F401  fail early, and name the version

    global FIXTURES
    if args.fixtures:
        FIXTURES = os.path.abspath(args.fixtures)
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="ebb-fixtures-")
    dirs = {"replay": os.path.join(work, "replay"), "fresh": os.path.join(work, "fresh")}
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    print(f"torch {torch.__version__} ({sys.executable}) against {FIXTURES}; work folder {work}")

    logs = {k: [] for k in dirs}
    threads = [threading.Thread(target=run_scripts,
                                args=(dirs[k], FIXTURES if k == "replay" else None, logs[k]))
               for k in dirs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # what the fresh run finds is reported (notes), only the replay run fails
    problems, notes = [], []
    for k in dirs:
        rc, out = logs[k][0]
        with open(os.path.join(work, f"{k}.log"), "w") as f:
            f.write(out)
        if rc and k == "replay":
            sys.exit(f"{out}\nFAIL: the fixture scripts ({k} run) exited with {rc}, output above")
        if rc:
            last = out.strip().splitlines()[-1:] or [""]
            notes.append(f"the seeded run stopped ({last[0]}; {k}.log in the work folder)")

    committed = sorted(f for f in os.listdir(FIXTURES) if f.endswith(".safetensors"))
    for k, d in dirs.items():
        made = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
        if set(made) != set(committed) and not (k == "fresh" and notes):
            (problems if k == "replay" else notes).append(
                f"the {k} run makes {sorted(set(made) - set(committed))} beyond the committed "
                f"files and misses {sorted(set(committed) - set(made))}")
    overall, over_elem, seeded_same = None, [], 0
    for fname in committed:
        if not os.path.exists(os.path.join(dirs["replay"], fname)):
            continue
        r = compare(fname, dirs["replay"], problems, fresh=False)
        differ = None  # the seeded run made no such file
        if os.path.exists(os.path.join(dirs["fresh"], fname)):
            differ = compare(fname, dirs["fresh"], notes, fresh=True)["differ"]
        line = f"{fname:40s} {r['exact']:3d} exact"
        if r["computed"] and r["identical"] == r["computed"]:
            line += f", {r['computed']:3d} computed, all bit for bit"
        elif r["computed"]:
            w = r["worst"]
            line += (f", {r['computed']:3d} computed ({r['identical']} bit for bit): worst {w[1]} "
                     f"{w[2]:.2e} = {w[0]:.3f} of {w[3]:g}")
            if overall is None or w[0] >= overall[0]:
                overall = w + (fname,)
        if r["bf16"] is not None:
            line += f"; bfloat16 (reported, not checked) worst {r['bf16'][0]} {r['bf16'][1]:.2e}"
        if r["per_elem"] is not None and r["per_elem"][2] > 0:
            w = r["per_elem"]
            line += f"; per element {w[1]} {w[2]:.2e}"
            if w[0] > 1:
                over_elem.append(f"{fname} {w[1]} {w[2]:.2e}")
        if differ:
            name, d = max(differ, key=lambda x: x[1])
            line += (f"; the seeded run differs in {len(differ)} input(s), most {name} by {d:.2e}"
                     " (checked from the committed ones)")
        elif differ is not None:
            seeded_same += 1
        print(line)

    print(f"{len(committed)} fixtures; the seeded run reproduces every input and weight of {seeded_same}")
    if overall is not None:
        print(f"worst of all: {overall[4]} {overall[1]} {overall[2]:.2e} "
              f"({overall[0]:.3f} of its bound {overall[3]:g})")
    if over_elem:
        print(f"note: beyond test_optim's per element 1e-6 (not a failure: see "
              f"tests/parity/README.md): {'; '.join(over_elem)}")
    for n in notes:
        print(f"note: {n}")
    if problems:
        print(f"\nFAIL: the committed fixtures do not match torch {torch.__version__}:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        sys.exit(1)
    print(f"OK: every committed fixture matches torch {torch.__version__}")
    if not args.work:
        shutil.rmtree(work)  # a temporary folder of our own; --work DIR keeps it


if __name__ == "__main__":
    main()
