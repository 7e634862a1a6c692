#!/usr/bin/env python3
"""PyTorch eager on a GPU for tests/gpu/run.sh: the bench's own PyTorch twins
(tests/bench/torch_models.py), at the sizes of tests/bench/run.py's SUITE,
timed as run.py times them (inference_mode, the output released inside the
timed region), with a device synchronisation closing each forward so that
the time is the GPU's, as ebb's CUDA times are.

  torch_eager.py ROWS OUT [--device cuda]

ROWS: tab-separated lines of workload, config, params, binds, fills,
plan JSON (`ebb plan --json` for those sizes: the input's shape), repeats.
OUT: one `pytorch` line of run.sh's summary per row: the median time in ms
(or "n/a (why)"), the peak bytes one forward allocates above its input
and parameters (torch.cuda.max_memory_allocated), and the median time of
torch.compile(mode="reduce-overhead") (CUDA graphs behind Inductor) for the
rows EBB_GPU_COMPILE_ROWS names ("workload:config,...", default
residual_tower:dispatch: each compile takes tens of seconds), else "-"."""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))


def parse_csv(s, conv):
    return {} if s == "-" else {k: conv(v) for k, v in (kv.split("=", 1) for kv in s.split(","))}


def prepare(torch, torch_models, device, workload, params, fills, plan_json):
    """The bench's twin of the workload, in eval mode on the device with the
    fills applied, and a random input of the plan's shape (token ids for a
    language model)."""
    with open(plan_json) as f:
        shape = json.load(f)["inputs"][0]["shape"]
    model = torch_models.build(workload, parse_csv(params, int)).eval().to(device)
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in parse_csv(fills, float).items():
            named[name].fill_(value)
    if getattr(model, "takes_indices", False):
        # a language model takes int64 token ids below its vocabulary
        vocab = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
        return model, torch.randint(0, vocab, shape, device=device)
    return model, torch.randn(shape, device=device)


def one(torch, torch_models, device, workload, params, fills, plan_json, repeat):
    model, x = prepare(torch, torch_models, device, workload, params, fills, plan_json)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    with torch.inference_mode():
        for _ in range(5):
            model(x)
        sync()
        for _ in range(repeat):
            t0 = time.perf_counter()
            y = model(x)
            del y
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        peak = "-"
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            y = model(x)
            del y
            sync()
            peak = str(torch.cuda.max_memory_allocated() - base)
    return "%.3f" % statistics.median(times), peak


def compiled(torch, torch_models, device, workload, params, fills, plan_json, repeat):
    """The median ms of torch.compile(mode="reduce-overhead") on the same
    model and input, timed after its compile and graph recording."""
    model, x = prepare(torch, torch_models, device, workload, params, fills, plan_json)
    fast = torch.compile(model, mode="reduce-overhead")
    times = []
    with torch.no_grad():
        for _ in range(5):
            fast(x)
        torch.cuda.synchronize()
        for _ in range(repeat):
            t0 = time.perf_counter()
            y = fast(x)
            del y
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return "%.3f" % statistics.median(times)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--device")]
    device = "cuda"
    for a in sys.argv[1:]:
        if a.startswith("--device="):
            device = a.split("=", 1)[1]
    if len(args) != 2:
        sys.exit("usage: torch_eager.py ROWS OUT [--device=cuda]")
    rows_path, out_path = args
    out = open(out_path, "w")  # a line per row as it is done: a timeout keeps what was
    try:
        import torch
        import torch_models
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError("torch %s sees no CUDA device (torch.version.cuda %s)"
                               % (torch.__version__, torch.version.cuda))
    except Exception as e:  # every row says why
        why = "n/a (%s)" % str(e).replace("\t", " ").replace("\n", " ")[:120]
        with open(rows_path) as f:
            for line in f:
                w, c = line.split("\t")[:2]
                out.write("\t".join(["pytorch", w, c, why, "-", "-"]) + "\n")
        torch = None
    if torch is not None:
        print("PyTorch %s on %s" % (torch.__version__, device), file=sys.stderr)
        to_compile = set(os.environ.get("EBB_GPU_COMPILE_ROWS", "residual_tower:dispatch").split(","))
        with open(rows_path) as f:
            for line in f:
                w, c, params, _binds, fills, plan_json, repeat = line.rstrip("\n").split("\t")
                try:
                    med, peak = one(torch, torch_models, device, w, params, fills, plan_json,
                                    int(repeat))
                except Exception as e:
                    med, peak = "n/a (%s)" % str(e).replace("\t", " ").replace("\n", " ")[:120], "-"
                comp = "-"
                if device.startswith("cuda") and "%s:%s" % (w, c) in to_compile:
                    try:
                        comp = compiled(torch, torch_models, device, w, params, fills, plan_json,
                                        int(repeat))
                    except Exception as e:
                        comp = "n/a (%s)" % str(e).replace("\t", " ").replace("\n", " ")[:120]
                print("  %-16s %-8s %s ms, peak %s B, torch.compile %s ms" % (w, c, med, peak, comp),
                      file=sys.stderr, flush=True)
                out.write("\t".join(["pytorch", w, c, med, peak, comp]) + "\n")
                out.flush()
    out.close()


if __name__ == "__main__":
    main()
