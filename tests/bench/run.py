#!/usr/bin/python3
"""ebb's benchmark driver (issue 7): ebb, hand-written libtorch C++ and
PyTorch eager, side by side in one run, on time and peak tensor bytes, for
forwards and (issue 12) training steps.

ebb and its C++ twin run in one process (ebb_bench), interleaved forward by
forward (A B A B). PyTorch eager runs here, in this process. The two
processes take turns by rounds: a round of ebb/C++, a round of PyTorch, and
so on (which goes first alternates), so slow drift of the machine hits all
three alike. Everything runs with the same thread count.

On PyTorch 2.x (`make bench TORCH=pip`) a fourth engine joins the PyTorch
side: the same module through torch.compile (inductor, which generates C++
and builds it with g++), compiled once per workload before timing. Its
compile time is reported apart and not counted in its step times. Where
torch has no torch.compile (Debian's 1.13) those columns say n/a.

Run it with Debian's python3 (it needs python3-torch), or the python whose
torch matches the libtorch ebb_bench was built against:
    /usr/bin/python3 tests/bench/run.py --build build

With --device cuda (a CUDA libtorch and torch; tests/gpu/run.sh's train step)
the training rows run on the GPU instead: ebb's step, the C++ twin's and
PyTorch eager's, each with its model, optimizer state, input and target on
the device, each timed step between two device synchronisations, peaks from
the CUDA caching allocator's statistics. The forward rows, the Fashion-MNIST
epochs and the memory budgets stay CPU-only and are left out there.
"""
import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

# The thread count, the same for all three: set before numpy or torch load
# their BLAS, which read these once (OpenBLAS ignores torch.set_num_threads).
THREADS = int(os.environ.get("EBB_BENCH_THREADS", "1"))
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "EBB_BENCH_THREADS"):
    os.environ[_var] = str(THREADS)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

try:
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile
except ImportError as e:  # pragma: no cover - the message is the point
    sys.exit("bench: PyTorch eager needs Debian's python3-torch for %s (%s)\n"
             "       install it: sudo apt-get install -y python3-torch" % (sys.executable, e))

sys.path.insert(0, HERE)
import torch_models  # noqa: E402

# Timing plans. dispatch: tiny forwards, many of them; compute: large ones,
# at least 20 timed runs of each engine.
TIMING = {
    "dispatch": {"warmup": 50, "rounds": 10, "per_round": 30},
    "compute": {"warmup": 2, "rounds": 8, "per_round": 4},
}

# (workload, config, spec params, symbolic dim bindings, parameter fills)
SUITE = [
    ("mlp", "dispatch", {"d": 64}, {"batch": 8}, ""),
    ("mlp", "compute", {"d": 1024}, {"batch": 256}, ""),
    ("residual_tower", "dispatch", {"d": 64}, {"batch": 8}, ""),
    ("residual_tower", "compute", {"d": 1024}, {"batch": 256}, ""),
    ("gated_routing", "dispatch", {"d": 64, "hidden": 128}, {"batch": 8}, ""),
    ("gated_routing", "compute", {"d": 512, "hidden": 1024}, {"batch": 256}, ""),
    ("iterative_refine", "dispatch", {"d": 64}, {"batch": 8}, ""),
    ("iterative_refine", "compute", {"d": 1024}, {"batch": 256}, ""),
    # halt.bias = -1000: the learned halt never fires, so all three run the
    # same 10 iterations (the check itself still runs after each one).
    ("feedback", "dispatch", {"d": 64}, {"batch": 8}, "halt.bias=-1000"),
    ("feedback", "compute", {"d": 1024}, {"batch": 256}, "halt.bias=-1000"),
    ("transformer", "dispatch", {"d": 64, "heads": 4, "ff": 128}, {"batch": 8, "seq": 16}, ""),
    ("transformer", "compute", {"d": 512, "heads": 8, "ff": 2048}, {"batch": 16, "seq": 64}, ""),
    ("convnet", "dispatch", {"c": 16, "c2": 32}, {"batch": 8, "size": 16}, ""),
    ("convnet", "compute", {"c": 64, "c2": 128}, {"batch": 64, "size": 32}, ""),
    # nanoGPT: int64 token ids in, logits [B, T, vocab] out; trained per token
    ("gpt", "dispatch", {"vocab": 256, "block": 32, "layers": 2, "heads": 4, "d": 64},
     {"batch": 8, "seq": 32}, ""),
    ("gpt", "compute", {"vocab": 256, "block": 128, "layers": 4, "heads": 8, "d": 256},
     {"batch": 8, "seq": 128}, ""),
]

# Ops a workload needs beyond linear/gelu/layer_norm: skipped with a note when
# this build of ebb lacks them.
NEEDS = {"transformer": ["multi_head_attention", "layer_norm"],
         "convnet": ["conv2d", "batch_norm", "max_pool2d", "adaptive_avg_pool2d", "flatten"],
         "gpt": ["embedding", "positions", "narrow", "scaled_dot_product_attention",
                 "layer_norm"]}

TARGET_CXX = 1.05  # ebb <= 1.05 x C++, dispatch-bound
TARGET_PYT = 4.0   # ebb >= 4 x faster than PyTorch eager, dispatch-bound

# Training steps (forward, loss, backward, AdamW update): the loss per
# workload, cross_entropy on class targets where the output is a classifier's
# [B, 10] or a language model's [B, T, vocab] (per token, against [B, T]),
# mse on the output's shape otherwise. Workloads ebb cannot train
# yet (loops, routing) are found by ebb_compile refusing them, and skipped.
TRAIN_LOSS = {"mlp": "mse", "residual_tower": "cross_entropy",
              "gated_routing": "cross_entropy", "iterative_refine": "cross_entropy",
              "feedback": "cross_entropy", "transformer": "mse", "convnet": "cross_entropy",
              "gpt": "cross_entropy"}
# Workloads whose steps draw random numbers: their losses agree only roughly.
TRAIN_RANDOM = {"transformer": "dropout masks are drawn independently"}
# The two checked steps and the measured one come first and warm up; the
# compute-bound steps take 0.1-1 s each, so few of them are timed (no time
# target applies there).
TRAIN_TIMING = {
    "dispatch": {"warmup": 15, "rounds": 10, "per_round": 15},
    "compute": {"warmup": 0, "rounds": 3, "per_round": 1},
}
# On a GPU a compute-bound step takes milliseconds: those rows get a warm-up
# and as many timed steps as the dispatch-bound ones' rounds.
TRAIN_TIMING_GPU = {
    "dispatch": TRAIN_TIMING["dispatch"],
    "compute": {"warmup": 5, "rounds": 10, "per_round": 3},
}
# Where the training rows run (--device): "cpu", or "cuda"/"cuda:N".
DEVICE = "cpu"
# ebb's step against the C++ twin's and PyTorch eager's, by configuration:
# at most the twin's on dispatch-bound rows and at most 3% over it on
# compute-bound ones (the same ATen kernels either way); at most 0.85 x
# PyTorch eager's on dispatch-bound rows, at most equal on compute-bound ones.
TARGET_TRAIN_CXX = {"dispatch": 1.0, "compute": 1.03}
TARGET_TRAIN_PYT = {"dispatch": 0.85, "compute": 1.0}

# torch.compile (PyTorch 2.x only): the module compiled with the default
# backend (inductor) and mode. Forward rows compile it under inference_mode;
# training rows compile the module (AOTAutograd gives inductor its forward and
# its backward graph) and keep the loss, loss.backward()'s driver and AdamW
# eager, as `model = torch.compile(model)` does in a user's training loop.
# --no-compile or EBB_BENCH_COMPILE=0 leaves it out.
HAS_COMPILE = hasattr(torch, "compile")

# The clock the tables and targets read: "wall" (perf_counter/steady_clock
# around each forward or step), or "cpu", the thread's CPU time over the same
# region. With one intra-op thread a step's work runs on the calling thread,
# so on a machine shared with other work "cpu" leaves out the time spent
# preempted. Both are kept in results.json. --clock or EBB_BENCH_CLOCK.
CLOCK = os.environ.get("EBB_BENCH_CLOCK", "wall")
CLOCK_NAME = {"wall": "wall clock", "cpu": "thread CPU time"}
COMPILE = HAS_COMPILE and os.environ.get("EBB_BENCH_COMPILE", "1") != "0"


def csv(d):
    return ",".join("%s=%s" % kv for kv in d.items()) or "-"


class Ebb:
    """The ebb_bench process: ebb and the C++ twin; `args` its command-line
    options (["--device", "cuda"])."""

    def __init__(self, binary, env, args=()):
        self.p = subprocess.Popen([binary] + list(args), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
        self.info = self._read()
        if "error" in self.info:  # it refused to start (a device it cannot use)
            self.p.wait()
            raise RuntimeError(self.info["error"])

    def _read(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("ebb_bench exited (rc %s)" % self.p.wait())
        return json.loads(line)

    def ask(self, *words):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        r = self._read()
        if "error" in r:
            raise RuntimeError(r["error"])
        return r

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except OSError:
            pass
        self.p.wait()


def start_side(build, program, args=()):
    """The ebb side of a bench driver: BUILD/tests/bench/PROGRAM, started
    with `args`, refused when missing or when it runs another thread count
    than PyTorch here."""
    binary = os.path.join(build, "tests", "bench", program)
    if not os.path.exists(binary):
        raise RuntimeError("%s not found (configure with -DEBB_BUILD_BENCH=ON)" % binary)
    ebb = Ebb(binary, dict(os.environ), args)
    if ebb.info["threads"] != torch.get_num_threads():
        ebb.close()
        raise RuntimeError("ebb runs %d threads, PyTorch %d" % (ebb.info["threads"],
                                                             torch.get_num_threads()))
    return ebb


def load_export(prefix):
    with open(prefix + ".json") as f:
        manifest = json.load(f)["tensors"]
    data = np.fromfile(prefix + ".bin", dtype=np.float32)
    out = []
    for t in manifest:
        n = int(np.prod(t["shape"])) if t["shape"] else 1
        arr = data[t["offset"]:t["offset"] + n].reshape(t["shape"])
        out.append((t["name"], torch.from_numpy(arr.copy())))
    return out


def load_ebb_values(workload, model, named):
    """Copies ebb's exported values (name, tensor), in plan order, into the
    module's ebb_order(); a module that lists its names (ebb_names: nanoGPT's
    state_dict keys) must list ebb's."""
    order = model.ebb_order()
    if len(order) != len(named):
        raise RuntimeError("%s: PyTorch twin has %d parameters, ebb's plan %d"
                           % (workload, len(order), len(named)))
    if hasattr(model, "ebb_names"):
        for mine, (name, _) in zip(model.ebb_names(), named):
            if mine != name:
                raise RuntimeError("%s: PyTorch twin's %s is ebb's %s" % (workload, mine, name))
    with torch.no_grad():
        for p, (name, v) in zip(order, named):
            if tuple(p.shape) != tuple(v.shape):
                raise RuntimeError("%s: %s is %s in ebb, %s in PyTorch"
                                   % (workload, name, tuple(v.shape), tuple(p.shape)))
            p.copy_(v)


def model_input(model, x):
    """ebb's input as the module takes it: int64 token ids for a language
    model (exported as float32, whole numbers), else as it is."""
    return x.long() if getattr(model, "takes_indices", False) else x


def per_token(loss_fn):
    """loss_fn over a language model's logits [B, T, V] against [B, T] as
    nanoGPT computes it, on the flattened [B*T, V] and [B*T]; a classifier's
    [B, C] as it is."""
    def fn(out, y):
        if out.dim() == 3:
            return loss_fn(out.view(-1, out.size(-1)), y.view(-1))
        return loss_fn(out, y)
    return fn


def torch_twin(workload, params, prefix):
    """The PyTorch module with ebb's parameter values, its input, and the
    largest difference between its output and ebb's."""
    tensors = load_export(prefix)
    named = [t for t in tensors if not t[0].startswith(("input:", "output:"))]
    x = dict(tensors)["input:x"]
    y_ebb = dict(tensors)["output:y"]
    model = torch_models.build(workload, params).eval()
    load_ebb_values(workload, model, named)
    x = model_input(model, x)
    with torch.inference_mode():
        y = model(x)
    return model, x, y_ebb, float((y - y_ebb).abs().max())


def compile_counts():
    """What torch.compile has done so far in this process: graphs compiled,
    graph breaks, and inductor's on-disk FX graph cache hits and misses."""
    from torch._dynamo.utils import counters
    return {"graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "cache_misses": counters["inductor"]["fxgraph_cache_miss"]}


def compiled(first_call):
    """Runs first_call() (the call that compiles) on a clean dynamo state
    and returns its result, its seconds and what compiling did."""
    torch._dynamo.reset()
    before = compile_counts()
    t0 = time.perf_counter()
    out = first_call()
    info = {"compile_s": time.perf_counter() - t0}
    after = compile_counts()
    info.update({k: after[k] - before[k] for k in after})
    return out, info


def compile_forward(model, x, y_ebb):
    """torch.compile(model), compiled by its first forward under
    inference_mode; its compile facts and the largest difference between its
    output and ebb's."""
    cm = torch.compile(model)

    def first():
        with torch.inference_mode():
            return cm(x)
    y, info = compiled(first)
    info["max_abs_diff"] = float((y - y_ebb).abs().max())
    return cm, info


def torch_round(model, x, n, cpu=None):
    """n forwards' wall times in ms; their thread CPU times appended to cpu,
    when given."""
    times = []
    with torch.inference_mode():
        for _ in range(n):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            y = model(x)
            del y
            times.append((time.perf_counter() - t0) * 1e3)
            if cpu is not None:
                cpu.append((time.thread_time() - c0) * 1e3)
    return times


def torch_peak(model, x):
    """Peak tensor bytes of one forward from the profiler's memory events:
    the running sum of allocations and frees, above what was live before (the
    input and the parameters)."""
    def forward():
        y = model(x)
        del y
    with torch.inference_mode():
        model(x)
        return profiled_peak(forward)


def profiled_peak(fn):
    """Runs fn() once under the profiler and returns the peak of the running
    sum of its allocation and free events, in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes = []
    try:
        nodes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            n = stack.pop()
            nodes.append(n)
            stack.extend(n.children)
        allocs = [n for n in nodes if type(n.extra_fields).__name__.endswith("Allocation")]
        allocs.sort(key=lambda n: (n.start_time_ns, n.id))
        sizes = [n.extra_fields.alloc_size for n in allocs]
    except AttributeError:  # other torch versions: the flat "[memory]" events
        evs = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        evs.sort(key=lambda e: e.start_us())
        sizes = [e.nbytes() for e in evs]
    live = peak = 0
    for s in sizes:
        live += s
        peak = max(peak, live)
    return peak


def on_gpu():
    return DEVICE != "cpu"


def sync():
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if on_gpu():
        torch.cuda.synchronize(DEVICE)


def torch_train_twin(workload, params, prefix, loss, compile_model=False, amp=None):
    """The PyTorch module in training mode with ebb's initial parameter
    values (buffers too), the input and target ebb drew, and an AdamW; with
    compile_model, the step calls torch.compile(model) instead of model (it
    compiles at its first call). Model, input and target are on DEVICE
    before the optimizer is made, so its state is made there too. With amp
    (torch.bfloat16), the forward and the loss run under torch.autocast of
    that dtype and the backward and the update outside it, as PyTorch's
    automatic mixed precision recipe has it (no GradScaler for bfloat16)."""
    tensors = load_export(prefix)
    named = [t for t in tensors if not t[0].startswith(("input:", "target:"))]
    x, y = dict(tensors)["input:x"], dict(tensors)["target:y"]
    model = torch_models.build(workload, params, train=True).train()
    load_ebb_values(workload, model, named)
    x = model_input(model, x)
    if loss == "cross_entropy":
        y, loss_fn = y.long(), per_token(torch.nn.functional.cross_entropy)
    else:
        loss_fn = torch.nn.functional.mse_loss
    if on_gpu():
        model, x, y = model.to(DEVICE), x.to(DEVICE), y.to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if compile_model else model
    device_type = "cuda" if on_gpu() else "cpu"

    def region():
        return (torch.autocast(device_type=device_type, dtype=amp) if amp is not None
                else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with region():
            loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
        return loss
    step.held = (x, y)  # what the step reads beside the module (not its activations)
    return model, opt, step


def minor_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def torch_train_round(step, n, faults=None, cpu=None):
    """n steps' wall times in ms; each step's minor page faults and thread CPU
    time (ms) appended to faults and cpu, when given. On a GPU each step's
    clock starts with the device idle and stops once it has done the step's
    work (torch.cuda.synchronize), as ebb_bench times ebb and the C++ twin."""
    gpu = on_gpu()
    times = []
    for _ in range(n):
        if gpu:
            sync()
        f0 = minor_faults()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        step()
        if gpu:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) * 1e3)
        if faults is not None:
            faults.append(minor_faults() - f0)
    return times


def torch_train_peak(opt, step):
    """Peak tensor bytes of one training step, above what was live before it:
    parameters, optimizer state, input and target (the last step's gradients
    dropped first, as the step itself would). On a GPU the caching
    allocator's allocated-bytes statistics (block-rounded, as ebb's there)."""
    opt.zero_grad(set_to_none=True)
    if on_gpu():
        sync()
        base = torch.cuda.memory_allocated(DEVICE)
        torch.cuda.reset_peak_memory_stats(DEVICE)
        step()
        sync()
        return torch.cuda.max_memory_allocated(DEVICE) - base
    return profiled_peak(step)


COMPILE_LEGEND = (
    "tc: torch.compile(model) (inductor, default mode), compiled before timing; 'tc compile s': "
    "the compiling call's seconds, graphs made, graph breaks, 'cached' when inductor's FX graph "
    "cache served them all" if COMPILE else
    "tc: torch.compile n/a (%s)" % ("left out: --no-compile or EBB_BENCH_COMPILE=0" if HAS_COMPILE
                                    else "PyTorch %s has none" % torch.__version__))


def stats(ts):
    return {"median": statistics.median(ts), "min": min(ts), "max": max(ts), "n": len(ts)}


def run_one(ebb, export_dir, workload, config, params, binds, fills, log):
    spec = os.path.join(ROOT, "specs", "bench", workload + ".yaml")
    prefix = os.path.join(export_dir, "%s_%s" % (workload, config))
    setup = ebb.ask("setup", workload, spec, prefix, csv(params), csv(binds), fills or "-")
    model, x, y_ebb, pyt_diff = torch_twin(workload, params, prefix)
    cm, comp = None, None
    if COMPILE:
        try:
            cm, comp = compile_forward(model, x, y_ebb)
        except Exception as e:  # reported in the row; the other engines still run
            comp = {"failed": "%s: %s" % (type(e).__name__, str(e).split("\n")[0])}
            log("  %-16s %-8s torch.compile FAILED: %s" % (workload, config, comp["failed"]))
            torch._dynamo.reset()
    mem = ebb.ask("measure")
    mem["pytorch_peak"] = torch_peak(model, x)
    if cm is not None:
        mem["compile_peak"] = torch_peak(cm, x)
    else:
        comp = comp and {"failed": comp["failed"]}

    # PyTorch's turn: eager and compiled, which goes first alternating
    pyt = {"pytorch": lambda n, cpu=None: torch_round(model, x, n, cpu)}
    if cm is not None:
        pyt["compile"] = lambda n, cpu=None: torch_round(cm, x, n, cpu)
    plan = TIMING[config]
    ebb.ask("round", plan["warmup"])
    for run in pyt.values():
        run(plan["warmup"])
    t = {"ebb": [], "cxx": [], **{k: [] for k in pyt}}
    tcpu = {k: [] for k in t}
    for r in range(plan["rounds"]):
        sides = ["ebb", "pytorch"] if r % 2 == 0 else ["pytorch", "ebb"]
        for side in sides:
            if side == "ebb":
                res = ebb.ask("round", plan["per_round"])
                for k in ("ebb", "cxx"):
                    t[k] += res[k]
                    tcpu[k] += res[k + "_cpu"]
            else:
                for k in (list(pyt) if r % 4 < 2 else list(pyt)[::-1]):
                    t[k] += pyt[k](plan["per_round"], tcpu[k])
    del cm, pyt
    live = ebb.ask("teardown")["live_handles"]
    row = {"workload": workload, "config": config, "params": params, "binds": binds,
           "memory": mem, "compile": comp,
           "check": {"cxx_max_abs_diff": setup["cxx_max_abs_diff"],
                     "pytorch_max_abs_diff": pyt_diff,
                     "compile_max_abs_diff": comp.get("max_abs_diff") if comp else None,
                     "live_handles_after": live}}
    tm = set_times(row, t, tcpu)
    row["targets"] = judge(row)
    log("  %-16s %-8s ebb %8.3f ms  C++ %8.3f ms  PyTorch %8.3f ms%s" %
        (workload, config, tm["ebb"]["median"], tm["cxx"]["median"], tm["pytorch"]["median"],
         "  torch.compile %8.3f ms (compiled in %.1f s)" % (tm["compile"]["median"],
                                                           comp["compile_s"])
         if "compile" in tm else ""))
    return row


def run_train_one(ebb, export_dir, workload, config, params, binds, fills, log):
    spec = os.path.join(ROOT, "specs", "bench", workload + ".yaml")
    prefix = os.path.join(export_dir, "train_%s_%s" % (workload, config))
    loss = TRAIN_LOSS[workload]
    try:
        setup = ebb.ask("train_setup", workload, spec, prefix, csv(params), csv(binds),
                        fills or "-", loss)
    except RuntimeError as e:  # an ebb error: reported in the table, the rest still runs
        log("  %-16s %-8s training FAILED: %s" % (workload, config, e))
        ebb.ask("teardown")
        return {"workload": workload, "config": config, "failed": str(e),
                "targets": {"runs": "FAILED: %s" % e}}
    if "skipped" in setup:
        # ebb_compile's refusal, "SPEC:LINE:COL: error: KEY: node PATH: why; ...": the why
        why = setup["skipped"].split("error: ", 1)[-1].split(";")[0]
        log("  %-16s %-8s training skipped: %s" % (workload, config, why))
        return {"workload": workload, "config": config, "skipped": why,
                "message": setup["skipped"]}
    model, opt, step = torch_train_twin(workload, params, prefix, loss)
    pyt_loss = [float(step().item()) for _ in setup["ebb_loss"]]
    comp = None
    if COMPILE:
        # its own copy of ebb's initial values and its own AdamW; the first
        # step compiles the forward and the backward
        cmodel, copt, cstep = torch_train_twin(workload, params, prefix, loss,
                                               compile_model=True)
        try:
            first, comp = compiled(lambda: float(cstep().item()))
            comp["loss"] = [first] + [float(cstep().item()) for _ in setup["ebb_loss"][1:]]
        except Exception as e:  # reported in the row; the other engines still run
            comp = {"failed": "%s: %s" % (type(e).__name__, str(e).split("\n")[0])}
            log("  %-16s %-8s training torch.compile FAILED: %s" % (workload, config,
                                                                    comp["failed"]))
            torch._dynamo.reset()
    mem = ebb.ask("train_measure")
    mem["pytorch_peak"] = torch_train_peak(opt, step)
    ok = comp and "failed" not in comp
    if ok:
        mem["compile_peak"] = torch_train_peak(copt, cstep)

    pyt = {"pytorch": step}
    if ok:
        pyt["compile"] = cstep
    plan = TRAIN_TIMING[config]
    ebb.ask("train_round", plan["warmup"])
    for s in pyt.values():
        torch_train_round(s, plan["warmup"])
    t = {"ebb": [], "cxx": [], **{k: [] for k in pyt}}
    tcpu = {k: [] for k in t}
    faults = {k: [] for k in t}  # minor page faults per step
    graph_why = ""
    for r in range(plan["rounds"]):
        sides = ["ebb", "pytorch"] if r % 2 == 0 else ["pytorch", "ebb"]
        for side in sides:
            if side == "ebb":
                res = ebb.ask("train_round", plan["per_round"])
                for k in ("ebb", "cxx"):
                    t[k] += res[k]
                    tcpu[k] += res[k + "_cpu"]
                    faults[k] += res[k + "_faults"]
                # on a GPU: the same step replayed from a CUDA graph
                if res.get("ebb_graph"):
                    t.setdefault("graph", []).extend(res["ebb_graph"])
                graph_why = res.get("ebb_graph_why", "")
            else:
                for k in (list(pyt) if r % 4 < 2 else list(pyt)[::-1]):
                    t[k] += torch_train_round(pyt[k], plan["per_round"], faults[k], tcpu[k])
    del model, opt, step, pyt
    if comp:
        del cmodel, copt, cstep
        torch._dynamo.reset()
    loss_c = comp.get("loss") if comp else None
    live = ebb.ask("teardown")["live_handles"]
    row = {"workload": workload, "config": config, "params": params, "binds": binds,
           "loss": loss, "phases": setup["phases"], "trained_params": setup["trained"],
           "memory": mem, "compile": comp, "graph_why": graph_why,
           "minor_faults_per_step": {k: statistics.median(v) for k, v in faults.items()},
           "check": {"ebb_loss": setup["ebb_loss"], "cxx_loss": setup["cxx_loss"],
                     "pytorch_loss": pyt_loss, "compile_loss": loss_c,
                     "random": TRAIN_RANDOM.get(workload), "live_handles_after": live}}
    tm = set_times(row, t, tcpu)
    row["targets"] = judge_train(row)
    log("  %-16s %-8s train: ebb %8.3f ms  C++ %8.3f ms  PyTorch %8.3f ms%s; page faults per "
        "step %s" %
        (workload, config, tm["ebb"]["median"], tm["cxx"]["median"], tm["pytorch"]["median"],
         "  torch.compile %8.3f ms (compiled in %.1f s)" % (tm["compile"]["median"],
                                                           comp["compile_s"])
         if "compile" in tm else "",
         " ".join("%s %d" % kv for kv in row["minor_faults_per_step"].items())))
    return row


def set_times(row, wall, cpu):
    """The row's times by both clocks, and the ones its table and targets use
    (CLOCK's): time_ms and the ratios of their medians."""
    row["time_ms_wall"] = {k: stats(v) for k, v in wall.items()}
    row["time_ms_cpu"] = {k: stats(v) for k, v in cpu.items()}
    row["clock"] = CLOCK
    tm = row["time_ms"] = row["time_ms_" + CLOCK]
    row["ratio_ebb_cxx"] = tm["ebb"]["median"] / tm["cxx"]["median"]
    row["ratio_ebb_pytorch"] = tm["ebb"]["median"] / tm["pytorch"]["median"]
    if "compile" in tm:
        row["ratio_ebb_compile"] = tm["ebb"]["median"] / tm["compile"]["median"]
    if "graph" in tm:
        row["ratio_graph_pytorch"] = tm["graph"]["median"] / tm["pytorch"]["median"]
    return tm


def rel_diff(a, b):
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


def judge_train(row):
    """The training targets: 'ok', 'MISSED: why', or None where one does not
    apply."""
    m, tg = row["memory"], {}
    lim = TARGET_TRAIN_CXX[row["config"]]
    r = row["ratio_ebb_cxx"]
    tg["time_vs_cxx"] = "ok" if r <= lim else "MISSED: ebb/C++ = %.3f > %.2f" % (r, lim)
    lim = TARGET_TRAIN_PYT[row["config"]]
    r = row["ratio_ebb_pytorch"]
    tg["time_vs_pytorch"] = ("ok" if r <= lim else
                             "MISSED: ebb/PyTorch = %.3f > %.2f" % (r, lim))
    if "ratio_graph_pytorch" in row:  # the captured step, on a GPU
        r = row["ratio_graph_pytorch"]
        tg["graph_vs_pytorch"] = ("ok" if r <= lim else
                                  "MISSED: ebb graph/PyTorch = %.3f > %.2f" % (r, lim))
    tg["peak_le_pytorch"] = ("ok" if m["ebb_measured"] <= m["pytorch_peak"] else
                             "MISSED: measured %d > PyTorch %d" % (m["ebb_measured"],
                                                                   m["pytorch_peak"]))
    c = row["check"]
    # Same parameters, same input and target: the first step's loss is the
    # forward's, the second's shows the first update was the same. Dropout
    # draws different masks in each engine, so there only a rough match.
    tol_cxx, tol_pyt = (0.01, 0.01) if c["random"] else (1e-4, 1e-3)
    c["cxx_loss_rel_diff"] = rel_diff(c["ebb_loss"], c["cxx_loss"])
    c["pytorch_loss_rel_diff"] = rel_diff(c["ebb_loss"], c["pytorch_loss"])
    c["compile_loss_rel_diff"] = (rel_diff(c["ebb_loss"], c["compile_loss"])
                                  if c["compile_loss"] else None)
    tg["same_losses"] = ("ok" if c["cxx_loss_rel_diff"] <= tol_cxx and
                         c["pytorch_loss_rel_diff"] <= tol_pyt and
                         (c["compile_loss_rel_diff"] is None or
                          c["compile_loss_rel_diff"] <= tol_pyt) and
                         c["live_handles_after"] == 0 else "FAILED")
    return tg


def fmt_compile(comp):
    """A torch.compile row's compile cost: seconds of the compiling call, the
    graphs it made and the graph breaks; 'cached' when inductor's FX graph
    cache served every graph."""
    if not comp:
        return "n/a"
    if "failed" in comp:
        return "failed: " + comp["failed"][:80]
    if not comp["graphs"]:  # dynamo gave the frame up (e.g. a graph break in a loop)
        return "%.1f, no graph: runs eager" % comp["compile_s"]
    s = "%.1f, %d graph%s" % (comp["compile_s"], comp["graphs"], "" if comp["graphs"] == 1 else "s")
    if comp["graph_breaks"]:
        s += ", %d break%s" % (comp["graph_breaks"], "" if comp["graph_breaks"] == 1 else "s")
    if comp["cache_hits"] and not comp["cache_misses"]:
        s += ", cached"
    return s


def compile_cols(r):
    """torch.compile's time, ebb/torch.compile and its peak, or n/a."""
    if "compile" not in r.get("time_ms", {}):
        return ["n/a", "n/a", "n/a"]
    return [fmt_t(r["time_ms"]["compile"]), "%.3f" % r["ratio_ebb_compile"],
            str(r["memory"]["compile_peak"])]


def train_table(rows):
    head = ["workload", "config", "loss", "ebb ms med [min, max]", "C++ ms med [min, max]",
            "PyTorch ms med [min, max]", "tc ms med [min, max]", "ebb/C++", "ebb/PyT",
            "ebb/tc", "tc compile s", "ebb measured B", "ebb planned B", "C++ B", "PyTorch B",
            "tc B", "S1 C++", "S2 PyT", "S3 <=PyT B", "check"]
    body = []
    for r in rows:
        if "skipped" in r or "failed" in r:
            what = "skipped: " + r["skipped"] if "skipped" in r else "FAILED: " + r["failed"]
            body.append([r["workload"], r["config"], what] + [""] * (len(head) - 3))
            continue
        tm, m, tg = r["time_ms"], r["memory"], r["targets"]
        ct, cr, cb = compile_cols(r)
        body.append([r["workload"], r["config"], r["loss"], fmt_t(tm["ebb"]), fmt_t(tm["cxx"]),
                     fmt_t(tm["pytorch"]), ct, "%.3f" % r["ratio_ebb_cxx"],
                     "%.3f" % r["ratio_ebb_pytorch"], cr, fmt_compile(r.get("compile")),
                     str(m["ebb_measured"]), str(m["ebb_planned"]), str(m["cxx_peak"]),
                     str(m["pytorch_peak"]), cb,
                     short(tg.get("time_vs_cxx")), short(tg.get("time_vs_pytorch")),
                     short(tg["peak_le_pytorch"]), short(tg["same_losses"])])
    return head, body


def judge(row):
    """Each target: 'ok', 'MISSED: why', or None where it does not apply."""
    m, tg = row["memory"], {}
    if row["config"] == "dispatch":
        r = row["ratio_ebb_cxx"]
        tg["time_vs_cxx"] = "ok" if r <= TARGET_CXX else "MISSED: ebb/C++ = %.3f > %.2f" % (r, TARGET_CXX)
        s = 1.0 / row["ratio_ebb_pytorch"]
        tg["time_vs_pytorch"] = ("ok" if s >= TARGET_PYT else
                                 "MISSED: only %.2fx faster than PyTorch (< %.0fx)" % (s, TARGET_PYT))
    if m["ebb_measured"] == m["ebb_planned"]:
        tg["measured_eq_planned"] = "ok"
    else:
        tg["measured_eq_planned"] = "MISSED: measured %+d bytes vs planned" % (
            m["ebb_measured"] - m["ebb_planned"])
    worst = max(m["ebb_measured"], m["ebb_planned"])
    tg["peak_le_pytorch"] = ("ok" if worst <= m["pytorch_peak"] else
                             "MISSED: %d > PyTorch %d" % (worst, m["pytorch_peak"]))
    c = row["check"]
    tg["same_outputs"] = ("ok" if c["cxx_max_abs_diff"] <= 1e-5 and c["pytorch_max_abs_diff"] <= 1e-3
                          and (c["compile_max_abs_diff"] is None or
                               c["compile_max_abs_diff"] <= 1e-3)
                          and c["live_handles_after"] == 0 else "FAILED")
    return tg


def fmt_t(s):
    return "%.3f [%.3f, %.3f]" % (s["median"], s["min"], s["max"])


def short(v):
    if v is None:
        return "-"
    return "ok" if v == "ok" else ("FAIL" if v == "FAILED" else "MISS")


def table(rows):
    head = ["workload", "config", "ebb ms med [min, max]", "C++ ms med [min, max]",
            "PyTorch ms med [min, max]", "tc ms med [min, max]", "ebb/C++", "ebb/PyT", "ebb/tc",
            "tc compile s", "ebb measured B", "ebb planned B", "keep_all B", "PyTorch B",
            "tc B", "C++ B", "T1 C++", "T2 4x", "T3 m=p", "T4 <=PyT", "check"]
    body = []
    for r in rows:
        if "skipped" in r:
            body.append([r["workload"], r["config"], "skipped: " + r["skipped"]] + [""] * (len(head) - 3))
            continue
        tm, m, tg = r["time_ms"], r["memory"], r["targets"]
        ct, cr, cb = compile_cols(r)
        body.append([r["workload"], r["config"], fmt_t(tm["ebb"]), fmt_t(tm["cxx"]),
                     fmt_t(tm["pytorch"]), ct, "%.3f" % r["ratio_ebb_cxx"],
                     "%.3f" % r["ratio_ebb_pytorch"], cr, fmt_compile(r.get("compile")),
                     str(m["ebb_measured"]), str(m["ebb_planned"]), str(m["keep_all_measured"]),
                     str(m["pytorch_peak"]), cb, str(m["cxx_peak"]), short(tg.get("time_vs_cxx")),
                     short(tg.get("time_vs_pytorch")), short(tg["measured_eq_planned"]),
                     short(tg["peak_le_pytorch"]), short(tg["same_outputs"])])
    return head, body


def render_text(head, body):
    rows = [b for b in body if not b[2].startswith(("skipped", "FAILED"))]
    w = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w[i]) if i < 2 else str(c).rjust(w[i])
                       for i, c in enumerate(head))]
    lines.append("  ".join("-" * x for x in w))
    for b in body:
        if b[2].startswith(("skipped", "FAILED")):
            lines.append("%s  %s  %s" % (b[0].ljust(w[0]), b[1].ljust(w[1]), b[2]))
        else:
            lines.append("  ".join(str(c).ljust(w[i]) if i < 2 else str(c).rjust(w[i])
                                   for i, c in enumerate(b)))
    return "\n".join(lines)


def render_md(head, body):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for b in body:
        out.append("| " + " | ".join(str(c) for c in b) + " |")
    return "\n".join(out)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def machine(ebb_info, threads):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"nproc": os.cpu_count(), "cpu": cpu, "libtorch": ebb_info.get("libtorch"),
            "pytorch": torch.__version__, "python": platform.python_version(),
            "threads": threads, "ebb_bench_threads": ebb_info.get("threads"),
            "pytorch_threads": torch.get_num_threads()}
    if on_gpu():
        info["device"] = DEVICE
        info["gpu"] = torch.cuda.get_device_name(DEVICE)
        info["ebb_bench_device"] = ebb_info.get("device")
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build folder holding tests/bench/ebb_bench")
    ap.add_argument("--bin", help="the ebb_bench binary (default: BUILD/tests/bench/ebb_bench)")
    ap.add_argument("--only", action="append", help="workload(s) to run (repeatable)")
    ap.add_argument("--config", choices=["dispatch", "compute"], help="one configuration only")
    ap.add_argument("--no-train", action="store_true", help="forwards only, no training rows")
    ap.add_argument("--train-only", action="store_true", help="training rows only")
    ap.add_argument("--no-fashion", action="store_true",
                    help="without the Fashion-MNIST epochs against PyTorch (--only fashion: "
                         "those alone)")
    ap.add_argument("--no-remat", action="store_true",
                    help="without training under memory budgets (--only remat: those alone)")
    ap.add_argument("--no-first-steps", action="store_true",
                    help="without the first training steps' peaks against PyTorch "
                         "(--only first_steps: those alone)")
    ap.add_argument("--no-precision", action="store_true",
                    help="without the mixed-precision training rows, bf16 against fp32 and "
                         "PyTorch autocast (--only precision: those alone)")
    ap.add_argument("--no-generate", action="store_true",
                    help="without generation through a key/value cache against PyTorch eager "
                         "(--only generate: those alone)")
    ap.add_argument("--clock", choices=["wall", "cpu"],
                    help="the clock the tables and targets read (default wall, or "
                         "EBB_BENCH_CLOCK); results.json keeps both")
    ap.add_argument("--no-compile", action="store_true",
                    help="without the torch.compile columns (PyTorch 2.x; n/a on 1.x)")
    ap.add_argument("--fashion-full", action="store_true",
                    help="time whole Fashion-MNIST epochs for every model (default: part of "
                         "the CNN's)")
    ap.add_argument("--device", default="cpu",
                    help="where the training rows run: cpu (the default) or cuda[:N]; off "
                         "the CPU only the training rows run (--train-only)")
    ap.add_argument("--out", help="folder for the exports and results (default: BUILD/bench)")
    ap.add_argument("--train-rows",
                    help="also append each training row to this file as one JSON line as "
                         "soon as it is done (a run cut short keeps the rows it finished)")
    args = ap.parse_args()

    binary = args.bin or os.path.join(args.build, "tests", "bench", "ebb_bench")
    if not os.path.exists(binary):
        sys.exit("bench: %s not found (configure with -DEBB_BUILD_BENCH=ON)" % binary)
    out_dir = args.out or os.path.join(args.build, "bench")
    os.makedirs(out_dir, exist_ok=True)

    global COMPILE, COMPILE_LEGEND, CLOCK, DEVICE, TRAIN_TIMING
    ebb_args = []
    if args.device != "cpu":
        if not args.device.startswith("cuda"):
            sys.exit("bench: error: --device %s: the devices are cpu and cuda[:N]" % args.device)
        if not torch.cuda.is_available():
            sys.exit("bench: error: --device %s: PyTorch %s sees no CUDA device (torch.version."
                     "cuda %s)" % (args.device, torch.__version__, torch.version.cuda))
        if args.no_train:
            sys.exit("bench: error: --device %s runs the training rows only; --no-train leaves "
                     "nothing" % args.device)
        DEVICE = args.device
        TRAIN_TIMING = TRAIN_TIMING_GPU
        ebb_args = ["--device", DEVICE]
        # the forward rows, Fashion-MNIST, the memory budgets and the
        # mixed-precision rows are CPU-only
        args.train_only = args.no_fashion = args.no_remat = args.no_first_steps = True
        args.no_precision = args.no_generate = True
    if args.clock:
        CLOCK = args.clock
    if CLOCK not in ("wall", "cpu"):
        sys.exit("bench: EBB_BENCH_CLOCK is wall or cpu, not %r" % CLOCK)
    if args.no_compile and COMPILE:
        COMPILE = False
        COMPILE_LEGEND = "tc: torch.compile n/a (left out: --no-compile)"
    if COMPILE:
        # inductor's caches (generated C++, built kernels, FX graphs) in the
        # build folder rather than /tmp, unless the caller chose a place
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              os.path.abspath(os.path.join(out_dir, "torchinductor")))
    threads = THREADS
    torch.set_num_threads(threads)
    try:
        ebb = Ebb(binary, dict(os.environ), ebb_args)
    except RuntimeError as e:
        sys.exit("bench: error: %s: %s" % (binary, e))
    info = machine(ebb.info, threads)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    info["clock"] = CLOCK
    info["torch_compile"] = ("inductor, cache %s" % os.environ["TORCHINDUCTOR_CACHE_DIR"]
                             if COMPILE else COMPILE_LEGEND.split("(", 1)[-1].rstrip(")"))
    log("bench: %d threads, libtorch %s, PyTorch %s, %s x %s; torch.compile: %s" %
        (threads, info["libtorch"], info["pytorch"], info["nproc"], info["cpu"],
         info["torch_compile"]))
    if on_gpu():
        log("bench: the training rows on %s (%s); the forward rows, Fashion-MNIST, the "
            "memory budgets and the mixed-precision rows are left out (CPU-only)"
            % (DEVICE, info["gpu"]))

    rows, train_rows, fashion_rows, remat_rows, first_rows = [], [], [], [], []
    precision_rows, generate_rows = [], []
    rows_out = open(args.train_rows, "a") if args.train_rows else None

    def train_row(row):
        train_rows.append(row)
        if rows_out:
            rows_out.write(json.dumps(row) + "\n")
            rows_out.flush()
    remat = (not args.no_remat and not args.no_train and not args.config and
             (not args.only or "remat" in args.only))
    fashion = (not args.no_fashion and not args.no_train and not args.config and
               (not args.only or "fashion" in args.only))
    first_steps = (not args.no_first_steps and not args.no_train and not args.config and
                   (not args.only or "first_steps" in args.only))
    precision = (not args.no_precision and not args.no_train and not args.config and
                 (not args.only or "precision" in args.only))
    generate = (not args.no_generate and not args.config and
                (not args.only or "generate" in args.only))
    load_before = loadavg()
    t0 = time.time()
    spent = {"forward": 0.0, "train": 0.0, "fashion": 0.0, "remat": 0.0,
             "first_steps": 0.0, "precision": 0.0, "generate": 0.0}  # seconds per kind
    try:
        suite = [w for w in SUITE if (not args.only or w[0] in args.only) and
                 (not args.config or w[1] == args.config)]
        for workload, config, params, binds, fills in suite:
            missing = [op for op in NEEDS.get(workload, []) if not ebb_has_op(ebb, op)]
            if missing:
                skip = {"workload": workload, "config": config,
                        "skipped": "ebb has no op " + ", ".join(missing)}
                rows.append(skip)
                train_row(dict(skip))
                log("  %-16s %-8s skipped: no op %s" % (workload, config, ", ".join(missing)))
                continue
            if not args.train_only:
                t1 = time.time()
                rows.append(run_one(ebb, out_dir, workload, config, params, binds, fills, log))
                spent["forward"] += time.time() - t1
            if not args.no_train:
                t1 = time.time()
                if on_gpu():
                    # one row failing on the GPU (a kernel, memory) is that row's FAILED
                    # and the others still run, in a new ebb_bench if that one died
                    try:
                        row = run_train_one(ebb, out_dir, workload, config, params, binds,
                                            fills, log)
                    except Exception as e:
                        why = "%s: %s" % (type(e).__name__, str(e).split("\n")[0])
                        log("  %-16s %-8s training FAILED: %s" % (workload, config, why))
                        row = {"workload": workload, "config": config, "failed": why,
                               "targets": {"runs": "FAILED: %s" % why}}
                        try:
                            ebb.ask("teardown")
                        except (RuntimeError, OSError, ValueError):
                            pass
                        if ebb.p.poll() is not None:
                            ebb = Ebb(binary, dict(os.environ), ebb_args)
                    train_row(row)
                else:
                    train_row(run_train_one(ebb, out_dir, workload, config, params, binds,
                                            fills, log))
                spent["train"] += time.time() - t1
        if fashion:
            import fashion as fashion_bench  # imports this file as `run`
            t1 = time.time()
            fashion_rows = fashion_bench.run_all(args.build, out_dir, args.fashion_full, log)
            spent["fashion"] += time.time() - t1
        if remat:
            import remat as remat_bench  # imports this file as `run`
            t1 = time.time()
            remat_rows = remat_bench.run_all(args.build, out_dir, log)
            spent["remat"] += time.time() - t1
        if first_steps:
            import first_steps as first_bench  # imports this file as `run`
            t1 = time.time()
            first_rows = first_bench.run_all(args.build, out_dir, log)
            spent["first_steps"] += time.time() - t1
        if precision:
            import precision as precision_bench  # imports this file as `run`
            t1 = time.time()
            precision_rows = precision_bench.run_all(args.build, out_dir, log, CLOCK)
            spent["precision"] += time.time() - t1
        if generate:
            import generate as generate_bench  # imports this file as `run`
            t1 = time.time()
            generate_rows = generate_bench.run_all(args.build, out_dir, log)
            spent["generate"] += time.time() - t1
    finally:
        ebb.close()
        if rows_out:
            rows_out.close()
    elapsed = time.time() - t0
    info["loadavg_before"], info["loadavg_after"] = load_before, loadavg()

    head, body = table(rows)
    text = render_text(head, body)
    thead, tbody = train_table(train_rows)
    misses = []
    for kind, rs in (("", rows), ("training ", train_rows), ("", fashion_rows),
                     ("memory budget ", remat_rows), ("first steps ", first_rows),
                     ("mixed precision ", precision_rows), ("generate ", generate_rows)):
        for r in rs:
            for k, v in r.get("targets", {}).items():
                if v and v != "ok":
                    misses.append("%s%s %s: %s" % (kind, r.get("model") or "%s/%s" % (
                        r["workload"], r["config"]), k, v))
    print()
    print("machine: %(nproc)s x %(cpu)s; libtorch %(libtorch)s; PyTorch %(pytorch)s; "
          "threads %(threads)s (intra-op, all engines); clock %(clock)s; "
          "torch.compile: %(torch_compile)s; "
          "load average %(loadavg_before)s before, %(loadavg_after)s after" % info)
    if on_gpu():
        print("device: the training rows ran on %(device)s, %(gpu)s; each timed step between "
              "two device synchronisations; peaks from the CUDA caching allocator" % info)
    if rows:
        print()
        print("ebb bench, forwards: times in ms (%s) over %s; peaks in bytes above the input "
              "and parameters" % (CLOCK_NAME[CLOCK], ", ".join("%s %d runs" % (c, p["rounds"] * p["per_round"])
                                       for c, p in TIMING.items())))
        print(text)
        print("T1: ebb <= %.2f x C++ (dispatch)  T2: ebb >= %.0fx faster than PyTorch (dispatch)  "
              "T3: ebb measured == planned  T4: ebb measured and planned <= PyTorch  "
              "check: outputs agree, no handle leaked" % (TARGET_CXX, TARGET_PYT))
        print(COMPILE_LEGEND)
    if train_rows:
        print()
        print("ebb bench, training steps (forward, loss, backward, AdamW lr 1e-3): times in ms "
              "(%s) over %s; peaks in bytes above the parameters, optimizer state, input and "
              "target" % (CLOCK_NAME[CLOCK], ", ".join("%s %d steps" % (c, p["rounds"] * p["per_round"])
                                                       for c, p in TRAIN_TIMING.items())))
        print(render_text(thead, tbody))
        print("S1: ebb <= %.2f x C++ (dispatch), <= %.2f x (compute)  S2: ebb <= %.2f x "
              "PyTorch eager (dispatch), <= %.2f x (compute)  S3: ebb measured <= PyTorch eager  "
              "check: the first two steps' losses agree, no handle leaked"
              % (TARGET_TRAIN_CXX["dispatch"], TARGET_TRAIN_CXX["compute"],
                 TARGET_TRAIN_PYT["dispatch"], TARGET_TRAIN_PYT["compute"]))
        print(COMPILE_LEGEND)
    if fashion_rows:
        fhead, fbody = fashion_bench.table(fashion_rows)
        print()
        print("ebb bench, Fashion-MNIST training against PyTorch eager (batch %d, AdamW lr 1e-3, "
              "the same order and initial weights)" % fashion_bench.BATCH)
        print(render_text(fhead, fbody))
        print(fashion_bench.LEGEND)
    if remat_rows:
        print()
        print("ebb bench, training under a memory budget (AdamW lr 1e-3; ebb_compile_options."
              "memory_budget against torch.utils.checkpoint): step times in ms, peaks in bytes "
              "above the parameters, optimizer state, input and target")
        print(remat_bench.render(remat_rows))
        print(remat_bench.LEGEND)
    if first_rows:
        print()
        print("ebb bench, the first %d training steps against PyTorch eager (AdamW lr 1e-3, "
              "fresh weights and optimizer, ebb's initial values on both sides): peaks in bytes "
              "above the parameters, optimizer state, input and target" % first_bench.STEPS)
        print(render_text(*first_bench.table(first_rows)))
        print(first_bench.LEGEND)
    if precision_rows:
        print()
        print("ebb bench, mixed-precision training steps (AdamW lr 1e-3): bf16 against fp32, ebb "
              "against PyTorch eager (autocast); times in ms (%s) over %d steps each, peaks in "
              "bytes above the parameters, optimizer state, input and target"
              % (CLOCK_NAME[CLOCK], precision_bench.TIMING["rounds"] *
                 precision_bench.TIMING["per_round"]))
        print(precision_bench.render(precision_rows))
        print(precision_bench.LEGEND)
    if generate_rows:
        print()
        print("ebb bench, generation through a key/value cache against PyTorch eager (batch 1, "
              "greedy, %s): tokens per second, prompt times in ms, bytes" % CLOCK_NAME[CLOCK])
        print(render_text(*generate_bench.table(generate_rows)))
        print(generate_bench.LEGEND)
    if misses:
        print("targets missed:")
        for m in misses:
            print("  " + m)
    else:
        print("every target met")
    print("(%.0f s: forward rows %.0f s, training rows %.0f s, Fashion-MNIST %.0f s, memory "
          "budgets %.0f s, first steps %.0f s, mixed precision %.0f s, generation %.0f s; "
          "results in %s/results.json and results.md)" % (
              elapsed, spent["forward"], spent["train"], spent["fashion"], spent["remat"],
              spent["first_steps"], spent["precision"], spent["generate"], out_dir))

    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"machine": info, "timing": TIMING, "rows": rows,
                   "train_timing": TRAIN_TIMING, "train_rows": train_rows,
                   "fashion_rows": fashion_rows, "remat_rows": remat_rows,
                   "first_steps_rows": first_rows, "precision_rows": precision_rows,
                   "precision_timing": precision_bench.TIMING if precision_rows else None,
                   "generate_rows": generate_rows,
                   "seconds": elapsed,
                   "seconds_by_kind": spent},
                  f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        if rows:
            f.write(render_md(head, body) + "\n")
        if train_rows:
            f.write("\nTraining steps:\n\n" + render_md(thead, tbody) + "\n")
        if fashion_rows:
            f.write("\nFashion-MNIST training against PyTorch eager:\n\n" +
                    render_md(fhead, fbody) + "\n")
        if remat_rows:
            f.write("\nTraining under a memory budget:\n\n" +
                    render_md(*remat_bench.table(remat_rows)) + "\n")
        if first_rows:
            f.write("\nThe first training steps against PyTorch eager:\n\n" +
                    render_md(*first_bench.table(first_rows)) + "\n")
        if precision_rows:
            f.write("\nMixed-precision training steps, bf16 against fp32 and PyTorch autocast:"
                    "\n\n" + render_md(*precision_bench.table(precision_rows)) + "\n")
        if generate_rows:
            f.write("\nGeneration through a key/value cache against PyTorch eager:\n\n" +
                    render_md(*generate_bench.table(generate_rows)) + "\n")
    return 0


def ebb_has_op(ebb, op):
    return bool(ebb.ask("has_op", op)["has"])


if __name__ == "__main__":
    sys.exit(main())
