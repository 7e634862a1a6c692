"""Data-parallel training, ebb against PyTorch's DistributedDataParallel
(issue 30): the same model, data and global batch in N processes on this
machine, both over Gloo on loopback; step time, per-rank peak and the bytes
each rank sends a step, for every N asked for.

    python3 tests/bench/ddp.py --build build [--nproc 2,4] [--steps 300] [--batch 64]

(`/usr/bin/python3` for Debian's torch 1.13, or the pip venv's python for
2.x; the torch must match the libtorch ebb was built with only for the
numbers to be comparable.) One process is always run too, as the baseline.

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
- Bytes sent per rank per step, measured: the loopback interface's
  transmit counters (bytes, packets) read before and after each run; every
  byte one rank sends another passes there once, with its IPv4 and TCP
  headers, and so do the receivers' ACKs. Each side runs twice, for
  --steps and for a fifth of them: the difference over the difference in
  steps is the steady traffic of a step, with what a run sends once
  (rendezvous, ebb's check that every rank trains the same run, the
  broadcast of rank 0's weights, DDP's parameter verification and
  broadcast, PyTorch's warm-up steps and final barrier) cancelled out.
  Divided by N: the ranks of a ring send alike. In parentheses the
  headers' share (packets x header bytes), and TCP's retransmitted
  segments a rank a step (/proc/net/snmp), which count too. Computed, for
  comparison: a ring all-reduce of every gradient sends 2 (N - 1) / N of
  their bytes, and both sides average every gradient once a step.
- The script re-runs itself in a network namespace of its own (`unshare
  -rn`) whose loopback carries nothing but its runs. Where that is refused
  it counts the machine's loopback, and other traffic there adds noise
  (the last line says which).

--model cnn trains specs/fashion_cnn.yaml and its twin (fashion.py's
FashionCNN) instead; DDP keeps batch_norm's running statistics each rank's
own (broadcast_buffers=False), as ebb does. --overlap lets ebb's buckets
travel while the backward goes on (DDP's always do), and --bucket-kib sets
both sides' bucket size (ebb's --bucket-size, DDP's bucket_cap_mb).

--model gpt trains specs/gpt.yaml (nanoGPT's shape at its defaults: 4
blocks of width 128, 4 heads, 64-byte windows, vocabulary 256, the lm_head
tied to the token embedding) and torch_models.GPT on every fortune Debian
ships laid end to end (the `fortunes` package): ebb's `--data text:FILE
--block 64`, the first 90% of the bytes with a window at each, in file
order; PyTorch cuts the same windows. The loss is the mean over every
token. The initial weights differ (each side's own init): the figures are
time, peak and traffic, not the weights.

With --zero both sides train with AdamW (lr 1e-3) and shard its state over
the ranks: ebb with `ebb train --nproc N --zero` (ZeRO-1), PyTorch with DDP
and `ZeroRedundancyOptimizer` over AdamW, which shards alike (each
parameter to one rank, largest first to the least loaded) and broadcasts
each rank's parameters after its step. The table then adds the optimizer
state a rank holds: ebb's from its plan (`ebb plan --train --data-parallel
N --zero --rank R --json`, what ebb_optimizer_new makes), PyTorch's summed
over the state tensors after the run (AdamW's `step` counters included),
rank 0's and the largest rank's. One process runs plain AdamW on both sides.

Intra-op threads: EBB_BENCH_THREADS (default 1) on both sides. Each side
runs alone, one after the other: on a machine with fewer cores than N x
threads the ranks share them.
"""
import argparse
import json
import os
import shutil
import socket
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
import torch_models  # noqa: E402  (GPT, nanoGPT's model)

SPECS = {"mlp": "specs/fashion_mlp.yaml", "cnn": "specs/fashion_cnn.yaml",
         "gpt": "specs/gpt.yaml"}
# --model gpt: specs/gpt.yaml's defaults (nanoGPT's shape, byte-level) on
# every fortune Debian ships, laid end to end as docs/training.md does
GPT = {"vocab": 256, "block": 64, "layers": 4, "heads": 4, "d": 128}
FORTUNES = "/usr/share/games/fortunes"
LR = 0.01
ZERO_LR = 1e-3  # AdamW's, for --zero
WARMUP = 5
PRIVATE_NETNS = "EBB_BENCH_PRIVATE_NETNS"  # set in the copy running in its own namespace


def private_loopback():
    """Gives this benchmark a loopback of its own: in the copy of the script
    that runs in a new network namespace, brings its loopback up and returns
    True; otherwise re-executes the script there with `unshare -rn` (which
    does not return), or returns False where that is refused."""
    if os.environ.get(PRIVATE_NETNS):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return True
    if shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"],
                               capture_output=True, check=False)
        if probe.returncode == 0:
            os.environ[PRIVATE_NETNS] = "1"
            os.execvp("unshare", ["unshare", "-rn", sys.executable] + sys.argv)
    return False


def traffic():
    """What this process's network namespace has sent so far: the loopback
    interface's bytes and packets (/proc/net/dev) and TCP's retransmitted
    segments (/proc/net/snmp), as a tuple."""
    with open("/proc/net/dev") as f:
        lo = [fields.split() for name, _, fields in (line.partition(":") for line in f)
              if name.strip() == "lo"]
    if not lo:
        raise RuntimeError("no loopback interface in /proc/net/dev")
    with open("/proc/net/snmp") as f:
        names, values = [line.split() for line in f if line.startswith("Tcp:")]
    return int(lo[0][8]), int(lo[0][9]), int(values[names.index("RetransSegs")])


def header_bytes():
    """Bytes of IPv4 and TCP header a packet on loopback carries (the
    counters count from the IP header on): 20 + 20, and 12 more for the
    timestamp option where net.ipv4.tcp_timestamps is on (Linux's default)."""
    with open("/proc/sys/net/ipv4/tcp_timestamps") as f:
        return 40 + (12 if f.read().strip() != "0" else 0)


def counted(fn, *args):
    """Runs fn(*args); returns its result and what was sent meanwhile
    (traffic()'s figures, as differences)."""
    before = traffic()
    result = fn(*args)
    return result, [x1 - x0 for x0, x1 in zip(before, traffic())]


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fortunes_text(tmp):
    """Debian's fortunes (not their .dat indexes), sorted by name and laid
    end to end in tmp/fortunes.txt: its path."""
    path = os.path.join(tmp, "fortunes.txt")
    names = sorted(os.path.join(d, f) for d, _, fs in os.walk(FORTUNES) for f in fs
                   if not f.endswith(".dat"))
    with open(path, "wb") as out:
        for name in names:
            with open(name, "rb") as f:
                out.write(f.read())
    return path


def data_args(cfg):
    """ebb train's data arguments for the model: Fashion-MNIST, or the
    fortunes in windows of GPT["block"] bytes."""
    if cfg["model"] != "gpt":
        return ["--data", "fashion-mnist"]
    return ["--data", "text:" + cfg["text"], "--block", str(GPT["block"])]


def ebb_side(build, nproc, steps, batch, cfg):
    """Trains with `ebb train` (--nproc N for N > 1; cfg: the model, and
    AdamW with --zero, --overlap, --bucket-size as asked) and returns rank
    0's step time (ms) and its measured and planned step peak."""
    zero = cfg["zero"]
    with tempfile.TemporaryDirectory(prefix="ebb_ddp_") as tmp:
        cmd = [os.path.join(build, "ebb"), "train", SPECS[cfg["model"]]] + data_args(cfg) + [
               "--steps",
               str(steps), "--batch", str(batch), "--device", "cpu", "--json", "--no-shuffle",
               "--optimizer", "adamw" if zero else "sgd", "--lr", str(ZERO_LR if zero else LR),
               "--checkpoint", os.path.join(tmp, "checkpoint.safetensors")]
        cmd += ["--nproc", str(nproc)] if nproc > 1 else ["--drop-last"]
        cmd += ["--zero"] if zero and nproc > 1 else []
        cmd += ["--overlap"] if cfg["overlap"] and nproc > 1 else []
        if cfg["bucket_kib"] and nproc > 1:
            cmd += ["--bucket-size", "%dKiB" % cfg["bucket_kib"]]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr))
    epoch = [json.loads(line) for line in out.stdout.splitlines()
             if line.startswith("{") and json.loads(line)["type"] == "epoch"][-1]
    return {"ms": 1000.0 * epoch["seconds"] / steps, "peak": epoch["peak_bytes"],
            "planned": epoch["planned_peak_bytes"]}


def ebb_state(build, nproc, batch, cfg):
    """The optimizer state each rank's plan holds (ebb_plan_optimizer_state_bytes),
    rank by rank."""
    out, zero = [], cfg["zero"]
    for rank in range(nproc):
        cmd = [os.path.join(build, "ebb"), "plan", SPECS[cfg["model"]], "--train", "--json",
               "--optimizer",
               "adamw" if zero else "sgd", "-i", "batch=%d" % (batch // nproc)]
        cmd += ["-i", "seq=%d" % GPT["block"]] if cfg["model"] == "gpt" else []
        if zero and nproc > 1:
            cmd += ["--data-parallel", str(nproc), "--zero", "--rank", str(rank)]
        plan = json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                                         check=True).stdout)
        out.append(plan["zero"]["optimizer_state_bytes"] if "zero" in plan
                   else plan["optimizer_state_bytes"])
    return out


def torch_rank(rank, nproc, port, steps, batch, cfg, queue):
    """One PyTorch rank: WARMUP untimed steps, `steps` timed ones, one
    profiled for the peak; rank 0 puts its figures on the queue, every rank
    the bytes of its optimizer's state."""
    torch.set_num_threads(THREADS)
    if nproc > 1:
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=nproc)
    torch.manual_seed(0)
    zero = cfg["zero"]
    if cfg["model"] == "gpt":
        model = torch_models.GPT(**GPT).train()
    else:
        model = (fashion.FashionMLP() if cfg["model"] == "mlp" else fashion.FashionCNN()).train()
    # batch_norm's running statistics stay each rank's own, as ebb keeps them
    ddp = {"broadcast_buffers": False}
    if cfg["bucket_kib"]:
        ddp["bucket_cap_mb"] = cfg["bucket_kib"] / 1024.0
    net = torch.nn.parallel.DistributedDataParallel(model, **ddp) if nproc > 1 else model
    if zero and nproc > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=ZERO_LR)
    elif zero:
        opt = torch.optim.AdamW(net.parameters(), lr=ZERO_LR)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=LR)
    if cfg["model"] == "gpt":
        # ebb's text:FILE: the first 90% of the bytes, a window at each
        with open(cfg["text"], "rb") as f:
            raw = f.read()
        tokens = torch.frombuffer(bytearray(raw[:len(raw) * 9 // 10]), dtype=torch.uint8).long()
        offsets = torch.arange(GPT["block"])
    else:
        images, labels = fashion.load_train()

    def batch_of(idx):
        if cfg["model"] == "gpt":
            at = idx.view(-1, 1) + offsets
            return tokens[at], tokens[at + 1]
        x = images[idx].float().div_(255)
        x = x.view(-1, 784) if cfg["model"] == "mlp" else x.view(-1, 1, 28, 28)
        return x, labels[idx].long()

    def step(k):
        x, y = batch_of(torch.arange(k * batch + rank, (k + 1) * batch, nproc))
        opt.zero_grad(set_to_none=True)
        out = net(x)
        loss = F.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
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
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    local = opt.optim if hasattr(opt, "optim") else opt  # ZeRO's local AdamW
    state = sum(t.numel() * t.element_size() for s in local.state.values()
                for t in s.values() if torch.is_tensor(t))
    if nproc > 1:
        dist.barrier()
        dist.destroy_process_group()
    queue.put({"rank": rank, "state": state})
    if rank == 0:
        queue.put({"ms": 1000.0 * sum(times) / len(times), "peak": peak,
                   "buckets": params if nproc > 1 else 0, "params": params})


def torch_side(nproc, steps, batch, cfg):
    """Trains with PyTorch in nproc spawned processes (DDP for more than
    one; zero: AdamW, sharded by ZeroRedundancyOptimizer) and returns rank
    0's figures (torch_rank), with "states", every rank's optimizer state."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, nproc, port, steps, batch, cfg, queue))
             for r in range(nproc)]
    for p in procs:
        p.start()
    result, states = None, [0] * nproc
    for _ in range(nproc + 1):
        got = queue.get(timeout=600)
        if "rank" in got:
            states[got["rank"]] = got["state"]
        else:
            result = got
    result["states"] = states
    for p in procs:
        p.join(timeout=60)
    return result


def sent_per_step(run, nproc, steps):
    """Runs run(steps) for the timed figures, and run(steps // 5) for the
    traffic: returns the long run's result with "sent", "packets" and
    "retransmits" added, per rank per step, the steady traffic of a step
    (what a run sends once cancels out in the difference)."""
    short = max(1, steps // 5)
    result, long_run = counted(run, steps)
    _, short_run = counted(run, short)
    per_step = [(x1 - x0) / (steps - short) / nproc for x0, x1 in zip(short_run, long_run)]
    result.update(zip(("sent", "packets", "retransmits"), per_step))
    return result


def print_table(rows, headers, zero):
    """Prints a markdown table, an ebb row and a PyTorch row for each
    (processes, ebb's figures, PyTorch's figures) of rows; the ratios are to
    PyTorch's at the same process count, its peak with DDP's buckets. zero:
    with the optimizer state a rank holds, rank 0's and the largest."""
    print("| processes | engine | ms/step | x PyTorch time | step peak a rank "
          "(ebb: planned = measured; PyTorch: step (+ DDP buckets)) | x PyTorch peak "
          "| bytes sent a rank a step, measured (TCP/IP headers) | TCP retransmits a rank a step "
          "| ring 2(N-1)/N x gradients | measured / ring |"
          + (" optimizer state a rank: rank 0, largest |" if zero else ""))
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if zero else ""))
    for n, e, t in rows:
        ring = t["params"] * 2 * (n - 1) // n
        pyt_peak = t["peak"] + t["buckets"]
        ebb_peak = "{:,} = {:,}".format(e["planned"], e["peak"])
        pyt_peak_text = ("{:,} ({:,})".format(t["peak"], pyt_peak) if n > 1
                         else "{:,}".format(pyt_peak))
        for name, side, peak, peak_text in (("ebb", e, e["peak"], ebb_peak),
                                            ("PyTorch", t, pyt_peak, pyt_peak_text)):
            cells = [str(n), name, "%.3f" % side["ms"], "%.2f" % (side["ms"] / t["ms"]), peak_text,
                     "%.3f" % (peak / pyt_peak),
                     "{:,.0f} ({:,.0f})".format(side["sent"], side["packets"] * headers),
                     "%.3f" % side["retransmits"], "{:,}".format(ring),
                     "%.3f" % (side["sent"] / ring) if ring else "-"]
            if zero:
                cells.append("{:,}, {:,}".format(side["states"][0], max(side["states"])))
            print("| " + " | ".join(cells) + " |")


def nprocs(text):
    """--nproc's value: process counts, comma-separated."""
    ns = sorted({int(n) for n in text.split(",")})
    if ns[0] < 1:
        raise argparse.ArgumentTypeError("process counts are 1 or more: %s" % text)
    return ns


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--nproc", type=nprocs, default=[2, 4],
                    help="process counts, comma-separated (default 2,4); one process always runs")
    ap.add_argument("--steps", type=int, default=300, help="timed steps (at least 2)")
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--model", choices=sorted(SPECS), default="mlp",
                    help="the MLP (default), the CNN or nanoGPT on the fortunes, each with "
                         "its PyTorch twin")
    ap.add_argument("--overlap", action="store_true",
                    help="ebb's buckets travel while the backward goes on (DDP's always do)")
    ap.add_argument("--bucket-kib", type=int, default=0,
                    help="a bucket's size on both sides (ebb's --bucket-size, DDP's "
                         "bucket_cap_mb); default each side's own")
    ap.add_argument("--zero", action="store_true",
                    help="AdamW sharded over the ranks: ebb's --zero against "
                         "ZeroRedundancyOptimizer")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2: the traffic is the difference with a shorter run")
    cfg = {"model": args.model, "zero": args.zero, "overlap": args.overlap,
           "bucket_kib": args.bucket_kib}
    private = private_loopback()
    tmp = tempfile.TemporaryDirectory(prefix="ebb_ddp_text_")
    if args.model == "gpt":
        cfg["text"] = fortunes_text(tmp.name)
    build = os.path.abspath(args.build)
    rows = []
    for n in sorted({1, *args.nproc}):
        e = sent_per_step(lambda steps: ebb_side(build, n, steps, args.batch, cfg), n, args.steps)
        e["states"] = ebb_state(build, n, args.batch, cfg)
        t = sent_per_step(lambda steps: torch_side(n, steps, args.batch, cfg), n, args.steps)
        rows.append((n, e, t))
    print_table(rows, header_bytes(), args.zero)
    print("%s, torch %s, %s%s%s, %d intra-op thread(s), %d steps of global batch %d (traffic: "
          "the difference with %d steps), %s loopback, %s"
          % (SPECS[args.model], torch.__version__,
             "AdamW sharded (ZeRO-1)" if args.zero else "SGD",
             ", ebb --overlap" if args.overlap else "",
             ", %d KiB buckets" % args.bucket_kib if args.bucket_kib else "", THREADS,
             args.steps, args.batch, max(1, args.steps // 5),
             "a private" if private else "the machine's (other traffic counts)",
             time.strftime("%Y-%m-%d")))
    tmp.cleanup()


if __name__ == "__main__":
    main()
