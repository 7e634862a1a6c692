"""Fashion-MNIST training, ebb against PyTorch eager (issue 13, item 6):
seconds per epoch and peak tensor bytes of a training step, for
specs/fashion_mlp.yaml and specs/fashion_cnn.yaml, side by side in one run.

Both sides train the same model (PyTorch's copy of ebb's initial weights)
with AdamW (lr 1e-3, torch.optim's other defaults, what `ebb train` uses),
batch 64, on the 60,000 training images held in memory as uint8, in the
same shuffled order (ebb's, for epoch 1 of `ebb train --seed 0`), with the
same intra-op thread count. A step's batch is made from memory on both
sides: the samples gathered and scaled to [0, 1] as float32, the labels as
int64 (ebb_dataset_batch on the ebb side; X[idx].float().div_(255) here).
Reading the files is not timed on either side; shuffling is done before.

ebb runs in its own process (ebb_fashion_bench, the C API as `ebb train`
calls it); PyTorch runs here. The epoch is cut into chunks that the two take
in turns (which goes first alternates), so drift in the machine's load hits
both alike. A side's epoch time is the sum of its chunks.

Peaks are measured as the training-step rows of run.py measure them: above
the bytes live when the step starts (parameters, AdamW state, the batch),
ebb's by its counting allocator (ebb_run_stats.measured_peak_bytes), PyTorch's
from the profiler's allocation events around one step (gradients of the last
step dropped first, as the step itself drops them). The first step also
creates AdamW's state (two tensors per parameter), so it is reported apart.

Run through run.py (`bash tests/bench/run.sh BUILD --only fashion`), which
sets the threads before torch loads.
"""
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import run as bench  # profiled_peak, load_export, Ebb, rendering

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
BATCH = 64
SEED = 0
# (name, spec, steps timed in `make bench`'s default run, or None for the
# whole epoch; chunks the timed steps are cut into)
MODELS = [
    ("fashion_mlp", "specs/fashion_mlp.yaml", None, 14),
    ("fashion_cnn", "specs/fashion_cnn.yaml", 150, 10),
]
CHECK_STEPS = 3   # untimed steps from the same weights first: losses compared, peaks measured
LOSS_TOL = 1e-3   # relative, the training rows' tolerance for PyTorch


class FashionMLP(nn.Module):
    """specs/fashion_mlp.yaml: 784-256-128-100-10 with relu."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 128)
        self.fc3, self.out = nn.Linear(128, 100), nn.Linear(100, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        x = F.relu(self.fc3(x))
        return self.out(x)

    def ebb_order(self):
        return [p for m in (self.fc1, self.fc2, self.fc3, self.out) for p in (m.weight, m.bias)]


class FashionCNN(nn.Module):
    """specs/fashion_cnn.yaml: 2 x (conv 3x3 -> batch_norm -> relu -> max_pool 2),
    flatten, linear 1568-128, relu, linear 128-10."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32)
        self.fc1, self.out = nn.Linear(32 * 7 * 7, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.out(x)

    def ebb_order(self):
        ps = []
        for conv, bn in ((self.conv1, self.bn1), (self.conv2, self.bn2)):
            ps += [conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                   bn.num_batches_tracked]
        return ps + [self.fc1.weight, self.fc1.bias, self.out.weight, self.out.bias]


def read_idx(path):
    """An IDX file (gzip or not) as a numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    if raw[2] != 0x08:
        raise RuntimeError("%s: only uint8 IDX files are read here" % path)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_train():
    x = read_idx(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(FASHION_DIR, "train-labels-idx1-ubyte.gz"))
    return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())


def torch_side(name, prefix):
    """The PyTorch model with ebb's initial values, its AdamW, and a step."""
    model = (FashionMLP() if name == "fashion_mlp" else FashionCNN()).train()
    named = bench.load_export(prefix)
    order = model.ebb_order()
    if len(order) != len(named):
        raise RuntimeError("%s: PyTorch has %d parameters, ebb %d" % (name, len(order), len(named)))
    with torch.no_grad():
        for p, (pname, v) in zip(order, named):
            if tuple(p.shape) != tuple(v.shape):
                raise RuntimeError("%s: %s is %s in ebb, %s in PyTorch"
                                   % (name, pname, tuple(v.shape), tuple(p.shape)))
            p.copy_(v)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return model, opt, step


class Batches:
    """Batch k of the epoch, made from the uint8 images in memory."""

    def __init__(self, images, labels, order, sample_shape):
        self.x = images.reshape((images.shape[0],) + sample_shape)
        self.y = labels
        self.order = order

    def __call__(self, k):
        idx = self.order[k * BATCH:(k + 1) * BATCH]
        return self.x[idx].float().div_(255), self.y[idx].long()


def torch_chunk(step, batches, start, count):
    losses, step_s = [], 0.0
    t0 = time.perf_counter()
    for k in range(start, start + count):
        x, y = batches(k)
        ts = time.perf_counter()
        losses.append(step(x, y))
        step_s += time.perf_counter() - ts
    return {"seconds": time.perf_counter() - t0, "step_seconds": step_s, "loss": losses}


def torch_state_bytes(model, opt):
    """Parameters and buffers (batch_norm's running statistics), and AdamW's
    exp_avg and exp_avg_sq (not its 4-byte step counts, which ebb keeps on
    the host)."""
    b = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for st in opt.state.values():
        b += sum(v.numel() * v.element_size() for k, v in st.items()
                 if torch.is_tensor(v) and k != "step")
    return b


def run_model(ebb, out_dir, name, spec, steps, chunks, images, labels, log):
    prefix = os.path.join(out_dir, name)
    setup = ebb.ask("setup", os.path.join(bench.ROOT, spec), BATCH, SEED, prefix)
    per_epoch = setup["steps_per_epoch"]
    order = torch.from_numpy(np.fromfile(prefix + ".order", dtype=np.int64))
    if len(order) != images.shape[0]:
        raise RuntimeError("%s: ebb's order has %d samples, the dataset %d"
                           % (name, len(order), images.shape[0]))
    sample = (784,) if name == "fashion_mlp" else (1, 28, 28)
    batches = Batches(images, labels, order, sample)
    model, opt, step = torch_side(name, prefix)

    # The same first steps on both sides: the losses must agree, and each
    # step's peak is measured (the first one creates AdamW's state).
    ebb_check = ebb.ask("steps", 0, CHECK_STEPS, "traced")
    pyt_loss, pyt_peak = [], []
    for k in range(CHECK_STEPS):
        x, y = batches(k)
        opt.zero_grad(set_to_none=True)
        box = []
        pyt_peak.append(bench.profiled_peak(lambda: box.append(step(x, y))))
        pyt_loss.append(box[0])
    state_bytes = torch_state_bytes(model, opt)

    # The timed epoch (or its first `steps`), in chunks taken in turns.
    n = per_epoch if steps is None else min(steps, per_epoch)
    cuts = [round(i * n / chunks) for i in range(chunks + 1)]
    t = {"ebb": [], "pytorch": []}
    ebb_loss, pyt_epoch_loss, ebb_peaks = [], [], []
    for i in range(chunks):
        a, c = cuts[i], cuts[i + 1] - cuts[i]
        for side in (["ebb", "pytorch"] if i % 2 == 0 else ["pytorch", "ebb"]):
            if side == "ebb":
                r = ebb.ask("steps", a, c)
                ebb_loss += r["loss"]
                ebb_peaks += r["peak"]
            else:
                r = torch_chunk(step, batches, a, c)
                pyt_epoch_loss += r["loss"]
            t[side].append(r)
    model = opt = step = None  # PyTorch's side is freed before ebb's is checked
    live = ebb.ask("teardown")["live_handles"]

    scale = per_epoch / n
    sec = {s: sum(r["seconds"] for r in t[s]) for s in t}
    step_sec = {s: sum(r["step_seconds"] for r in t[s]) for s in t}
    row = {
        "model": name, "spec": spec, "batch": BATCH, "steps_per_epoch": per_epoch,
        "steps_timed": n, "chunks": chunks,
        "seconds": sec, "step_seconds": step_sec,
        "epoch_seconds": {s: v * scale for s, v in sec.items()},
        "chunk_seconds": {s: [r["seconds"] for r in t[s]] for s in t},
        "memory": {
            # the first step with the AdamW state it creates counted in, on both sides
            "ebb_first": ebb_check["total"][0], "pytorch_first": pyt_peak[0],
            "ebb_first_measured": ebb_check["peak"][0],
            "ebb": max(ebb_check["peak"][1:] + ebb_peaks),
            "pytorch": max(pyt_peak[1:]),
            "ebb_planned": setup["planned_peak"],
            "ebb_checked_steps": ebb_check["peak"], "ebb_checked_total": ebb_check["total"],
            "pytorch_checked_steps": pyt_peak,
            "param_bytes": setup["param_bytes"],
            "ebb_state_bytes": setup["param_bytes"] + ebb_check["optimizer_state_bytes"],
            "pytorch_state_bytes": state_bytes,
        },
        "check": {
            "ebb_loss": ebb_check["loss"], "pytorch_loss": pyt_loss,
            "loss_rel_diff": bench.rel_diff(ebb_check["loss"], pyt_loss),
            "ebb_mean_loss": sum(ebb_loss) / len(ebb_loss),
            "pytorch_mean_loss": sum(pyt_epoch_loss) / len(pyt_epoch_loss),
            "live_handles_after": live,
        },
        "load_seconds_ebb": setup["load_seconds"],
    }
    e, p = row["epoch_seconds"]["ebb"], row["epoch_seconds"]["pytorch"]
    row["ratio_time"] = e / p
    m = row["memory"]
    row["ratio_peak"] = m["ebb"] / m["pytorch"]
    row["targets"] = {
        "time_le_pytorch": ("ok" if e <= p else
                            "MISSED: ebb %.2f s > PyTorch %.2f s per epoch" % (e, p)),
        "peak_le_pytorch": ("ok" if m["ebb"] <= m["pytorch"] and
                            m["ebb_first"] <= m["pytorch_first"] else
                            "MISSED: ebb %d > PyTorch %d bytes" % (
                                (m["ebb"], m["pytorch"]) if m["ebb"] > m["pytorch"] else
                                (m["ebb_first"], m["pytorch_first"])) +
                            ("" if m["ebb"] > m["pytorch"] else " at the first step")),
        "same_losses": ("ok" if row["check"]["loss_rel_diff"] <= LOSS_TOL and live == 0 and
                        m["ebb_state_bytes"] == m["pytorch_state_bytes"] else "FAILED"),
    }
    log("  %-12s %s: ebb %.2f s/epoch, PyTorch %.2f s/epoch; peak ebb %d B, PyTorch %d B"
        % (name, "epoch" if n == per_epoch else "%d of %d steps" % (n, per_epoch), e, p,
           m["ebb"], m["pytorch"]))
    return row


def run_all(build, out_dir, full, log):
    """Every model of MODELS; `full`: whole epochs for all of them."""
    binary = os.path.join(build, "tests", "bench", "ebb_fashion_bench")
    if not os.path.exists(binary):
        raise RuntimeError("%s not found (configure with -DEBB_BUILD_BENCH=ON)" % binary)
    t0 = time.time()
    images, labels = load_train()
    log("fashion: %d training images read in %.1f s (not timed)" % (images.shape[0],
                                                                  time.time() - t0))
    ebb = bench.start_side(build, "ebb_fashion_bench")
    rows = []
    try:
        for name, spec, steps, chunks in MODELS:
            rows.append(run_model(ebb, out_dir, name, spec, None if full else steps, chunks,
                                  images, labels, log))
    finally:
        ebb.close()
    return rows


def table(rows):
    head = ["model", "steps timed", "ebb s/epoch", "PyTorch s/epoch", "ebb/PyT", "ebb peak B",
            "PyTorch peak B", "ebb/PyT B", "ebb 1st step B", "PyTorch 1st step B",
            "params+AdamW B", "F1 time", "F2 peak", "check"]
    body = []
    for r in rows:
        m, tg = r["memory"], r["targets"]
        body.append([r["model"], "%d/%d" % (r["steps_timed"], r["steps_per_epoch"]),
                     "%.2f" % r["epoch_seconds"]["ebb"], "%.2f" % r["epoch_seconds"]["pytorch"],
                     "%.3f" % r["ratio_time"], str(m["ebb"]), str(m["pytorch"]),
                     "%.3f" % r["ratio_peak"], str(m["ebb_first"]), str(m["pytorch_first"]),
                     str(m["ebb_state_bytes"]),
                     bench.short(tg["time_le_pytorch"]), bench.short(tg["peak_le_pytorch"]),
                     bench.short(tg["same_losses"])])
    return head, body


LEGEND = ("F1: ebb's epoch time <= PyTorch's  F2: ebb's step peaks <= PyTorch's, the first "
          "step's and the others'. Peaks: bytes above the parameters, AdamW state and batch live "
          "when a step starts; 'peak' is the largest of every step after the first, '1st step' "
          "counts the AdamW state that step creates. check: the first %d steps' losses agree to "
          "%g, the same parameter and state bytes, no handle leaked. s/epoch: batches made from "
          "memory and steps; a partial row's is its steps' time x steps per epoch / steps timed"
          % (CHECK_STEPS, LOSS_TOL))
