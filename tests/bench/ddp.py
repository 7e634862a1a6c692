"""Data-parallel training, ebb against PyTorch's DistributedDataParallel
(issue 30): the same model, data and global batch in N processes on this
machine, both over Gloo on loopback.

    python3 tests/bench/ddp.py --build build [--nproc 2] [--steps 300] [--batch 64]

(`/usr/bin/python3` for Debian's torch 1.13, or the pip venv's python for
2.x; the torch must match the libtorch ebb was built with only for the
numbers to be comparable.)

- ebb: `ebb train specs/fashion_mlp.yaml --nproc N` (one process without
  --nproc, with --drop-last), SGD lr 0.01, the epoch's samples in file
  order (--no-shuffle), its `--json` epoch line: the seconds the steps took,
  and rank 0's measured and planned step peak (ebb_trainer_stats: above the
  parameters, gradients' buffers included).
- PyTorch: the same MLP (fashion.py's twin), SGD lr 0.01, DDP with the gloo
  backend (a plain module for one process), each rank taking its
  DistributedSampler share of the same global batches (sample i of a batch
  to rank i mod N), timed over the same steps after 5 untimed ones; rank
  0's step peak from the profiler's allocation events (run.py's
  profiled_peak), which does not see DDP's buckets: they are allocated with
  the model and kept, so the table adds them (the parameters' bytes) as a
  second figure.
- Bytes sent per rank per step: a ring all-reduce of every gradient sends
  2 (N - 1) / N of their bytes; both sides average every gradient once a
  step, so the figure is the same and computed, not measured.

Intra-op threads: EBB_BENCH_THREADS (default 1) on both sides. Each side
runs alone, one after the other: on a machine with fewer cores than N x
threads the ranks share them.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

THREADS = int(os.environ.get("EBB_BENCH_THREADS", "1"))
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = str(THREADS)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import fashion  # noqa: E402  (FashionMLP, load_train; imports run.py)
import run as bench  # noqa: E402  (profiled_peak)

SPEC = "specs/fashion_mlp.yaml"
LR = 0.01
WARMUP = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ebb_side(build, nproc, steps, batch):
    cmd = [os.path.join(build, "ebb"), "train", SPEC, "--data", "fashion-mnist", "--steps",
           str(steps), "--batch", str(batch), "--device", "cpu", "--json", "--no-shuffle",
           "--optimizer", "sgd", "--lr", str(LR), "--checkpoint",
           os.path.join(tempfile.mkdtemp(prefix="ebb_ddp_"), "checkpoint.safetensors")]
    cmd += ["--nproc", str(nproc)] if nproc > 1 else ["--drop-last"]
    t0 = time.time()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.time() - t0
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr))
    epoch = [json.loads(line) for line in out.stdout.splitlines()
             if line.startswith("{") and json.loads(line)["type"] == "epoch"][-1]
    return {"ms": 1000.0 * epoch["seconds"] / steps, "peak": epoch["peak_bytes"],
            "planned": epoch["planned_peak_bytes"], "wall": wall, "loss": epoch["loss"]}


def torch_rank(rank, nproc, port, steps, batch, queue):
    torch.set_num_threads(THREADS)
    if nproc > 1:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=nproc)
    torch.manual_seed(0)
    model = fashion.FashionMLP().train()
    net = torch.nn.parallel.DistributedDataParallel(model) if nproc > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    images, labels = fashion.load_train()

    def step(k):
        idx = torch.arange(k * batch + rank, (k + 1) * batch, nproc)
        x = images[idx].float().div_(255).view(-1, 784)
        y = labels[idx].long()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for k in range(WARMUP):
        step(k)
    times = []
    for k in range(WARMUP, WARMUP + steps):
        t0 = time.perf_counter()
        step(k)
        times.append(time.perf_counter() - t0)
    peak = bench.profiled_peak(lambda: step(WARMUP + steps))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    if nproc > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        queue.put({"ms": 1000.0 * sum(times) / len(times),
                   "ms_median": 1000.0 * statistics.median(times), "peak": peak,
                   "buckets": params if nproc > 1 else 0, "params": params})


def torch_side(nproc, steps, batch):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, nproc, port, steps, batch, queue))
             for r in range(nproc)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rows = []
    for n in sorted({1, args.nproc}):
        e = ebb_side(build, n, args.steps, args.batch)
        t = torch_side(n, args.steps, args.batch)
        grad_bytes = t["params"]
        sent = int(grad_bytes * 2 * (n - 1) / n)
        rows.append((n, e, t, sent))
    print("| processes | ebb ms/step | PyTorch ms/step | ebb/PyT time | ebb peak planned = measured "
          "| PyTorch step peak (+ DDP buckets) | ebb/PyT peak | bytes sent a step a rank |")
    print("|---|---|---|---|---|---|---|---|")
    for n, e, t, sent in rows:
        pyt = t["peak"] + t["buckets"]
        print("| %d | %.3f | %.3f | %.2f | %d = %d | %d (%d) | %.3f | %d |"
              % (n, e["ms"], t["ms"], e["ms"] / t["ms"], e["planned"], e["peak"], t["peak"],
                 pyt, e["peak"] / pyt, sent))
    print("torch %s, %d intra-op thread(s), %d steps of global batch %d, %s"
          % (torch.__version__, THREADS, args.steps, args.batch, time.strftime("%Y-%m-%d")))


if __name__ == "__main__":
    main()
