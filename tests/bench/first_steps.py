"""The first training steps, ebb against PyTorch eager (issue 25, part 5):
the peak of each of the first STEPS training steps from fresh weights and a
fresh AdamW (lr 1e-3, torch.optim's other defaults), the first step
included, for

- specs/resnet_small.yaml, batch 16 of 3x16x16: a ResNet-style CNN whose
  stride-2 convolutions take its maps down to 2x2 and 1x1, where CPU
  convolution leaves its direct kernels;
- specs/mnist_examples.yaml, batch 64 of 1x28x28: pytorch/examples'
  MNIST network (mnist/main.py's Net), trained with AdamW here,

side by side in one run. Per model and step: ebb's planned peak and its
measured one (ebb_run_stats), PyTorch eager's measured one, the ratio of
ebb's measured to PyTorch's, and a verdict: ebb measured <= planned and
<= PyTorch's, at every step, the first included.

Both sides train the same model: PyTorch's twin has ebb's parameter shapes
and starts from ebb's initial values (exported by the ebb side), on the same
randn input and class targets, repeated each step. The losses of the first
steps are compared (mnist_examples draws dropout masks independently on each
side, so only resnet_small's are held to LOSS_TOL).

Peaks are measured as the training-step rows of run.py measure them: above
the bytes live when the step starts (parameters, optimizer state, input and
target). ebb's from its counting allocator (ebb_run_stats.measured_peak_bytes,
next to planned_peak_bytes); ebb_optimizer_new() makes AdamW's state up front,
so no ebb step allocates any (the ebb side reports what each step made, and
it must be 0). PyTorch's from the profiler's allocation events around one
step after opt.zero_grad(set_to_none=True) (run.py's profiled_peak); its
first step also creates AdamW's state inside opt.step() (exp_avg and
exp_avg_sq per parameter, 2x the trained parameters' bytes), which stays
live after it: that step's peak counts it, as a first step does. The
"PyT state made" column gives those bytes.

ebb runs in its own process (ebb_first_steps_bench, the C API as `ebb train`
calls it); PyTorch runs here. Run through run.py
(`bash tests/bench/run.sh BUILD --only first_steps`), which sets the threads
before torch loads.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import run as bench  # Ebb, load_export, profiled_peak, rel_diff, short

STEPS = 3
SEED = 0
LOSS_TOL = 1e-3  # relative, the training rows' tolerance for PyTorch
# (name, spec, batch, what, dropout draws its own masks on each side)
MODELS = [
    ("resnet_small", "specs/resnet_small.yaml", 16,
     "stem, 5 residual blocks, 4 stride-2 downsamplings 16x16 -> 1x1, c 16", False),
    ("mnist_examples", "specs/mnist_examples.yaml", 64,
     "pytorch/examples mnist Net: conv 32, conv 64, max_pool, dropout, fc 128, fc 10", True),
]


def conv_bn_relu(cin, cout, stride):
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]


class Residual(nn.Module):
    """x + bn(conv(relu(bn(conv(x))))): the spec's `also: residual`."""

    def __init__(self, c):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                               nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.f(x)


class ResNetSmall(nn.Module):
    """specs/resnet_small.yaml: stem conv-bn-relu, residual, then four times
    (stride-2 conv-bn-relu, residual), global average pooling, linear head."""

    def __init__(self, c=16, classes=10):
        super().__init__()
        layers = conv_bn_relu(3, c, 1) + [Residual(c)]
        for _ in range(4):
            layers += conv_bn_relu(c, c, 2) + [Residual(c)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.body(x), 1)
        return self.head(torch.flatten(x, 1))

    def loss(self, out, y):
        return F.cross_entropy(out, y)


class MnistNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, as it is there."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)

    def loss(self, out, y):
        return F.nll_loss(out, y)


def ebb_order(model):
    """Parameters and buffers in ebb's model order: the layers in the order
    the forward runs them (their registration order here), convolutions and
    linears as weight, bias; batch norms as weight, bias, running_mean,
    running_var, num_batches_tracked."""
    out = []
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            out += [m.weight, m.bias]
        elif isinstance(m, nn.BatchNorm2d):
            out += [m.weight, m.bias, m.running_mean, m.running_var, m.num_batches_tracked]
    return out


def torch_side(name, prefix):
    """The twin with ebb's initial values, the input and target ebb drew,
    its AdamW, and a step (run.py's torch_train_twin's)."""
    model = (ResNetSmall() if name == "resnet_small" else MnistNet()).train()
    tensors = bench.load_export(prefix)
    named = [t for t in tensors if not t[0].startswith(("input:", "target:"))]
    x, y = dict(tensors)["input:x"], dict(tensors)["target:y"].long()
    order = ebb_order(model)
    if len(order) != len(named):
        raise RuntimeError("%s: PyTorch has %d parameters and buffers, ebb %d"
                           % (name, len(order), len(named)))
    with torch.no_grad():
        for p, (pname, v) in zip(order, named):
            if tuple(p.shape) != tuple(v.shape):
                raise RuntimeError("%s: %s is %s in ebb, %s in PyTorch"
                                   % (name, pname, tuple(v.shape), tuple(p.shape)))
            p.copy_(v)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return model, opt, step, x, y


def adamw_state_bytes(opt):
    """AdamW's exp_avg and exp_avg_sq (not its step counts)."""
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for k, v in st.items() if torch.is_tensor(v) and k != "step")


def verdict(planned, measured, pytorch):
    why = []
    if measured > planned:
        why.append("measured %d > planned %d" % (measured, planned))
    if measured > pytorch:
        why.append("ebb %d > PyTorch %d" % (measured, pytorch))
    return "ok" if not why else "MISSED: " + "; ".join(why)


def run_model(ebb, out_dir, name, spec, batch, what, random, log):
    prefix = os.path.join(out_dir, "first_steps_" + name)
    setup = ebb.ask("setup", os.path.join(bench.ROOT, spec), batch, SEED, prefix)
    e = ebb.ask("steps", STEPS)
    live = ebb.ask("teardown")["live_handles"]

    model, opt, step, x, y = torch_side(name, prefix)
    pyt_peak, pyt_loss, pyt_state = [], [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        state0 = adamw_state_bytes(opt)
        box = []
        pyt_peak.append(bench.profiled_peak(lambda: box.append(float(step().item()))))
        pyt_loss.append(box[0])
        pyt_state.append(adamw_state_bytes(opt) - state0)
    pyt_state_total = adamw_state_bytes(opt)
    model = opt = step = None  # PyTorch's side freed before the next model

    steps = []
    for k in range(STEPS):
        p, m, t = e["planned"][k], e["measured"][k], pyt_peak[k]
        steps.append({"step": k + 1, "ebb_planned": p, "ebb_measured": m, "pytorch": t,
                      "ratio": m / t, "ratio_planned": p / t,
                      "pytorch_state_made": pyt_state[k], "ebb_state_made": e["state_made"][k],
                      "over_step": e["over_step"][k], "over_bytes": e["over_bytes"][k],
                      "verdict": verdict(p, m, t)})
    loss_diff = bench.rel_diff(e["loss"], pyt_loss)
    same = (live == 0 and all(s == 0 for s in e["state_made"]) and
            setup["optimizer_state_bytes"] == pyt_state_total and
            (random or loss_diff <= LOSS_TOL))
    row = {"model": name, "spec": spec, "batch": batch, "what": what,
           "input_shape": list(x.shape), "steps": steps,
           "setup": setup,
           "check": {"ebb_loss": e["loss"], "pytorch_loss": pyt_loss, "loss_rel_diff": loss_diff,
                     "random": "dropout draws its own masks on each side" if random else None,
                     "ebb_state_bytes": setup["optimizer_state_bytes"],
                     "pytorch_state_bytes": pyt_state_total, "live_handles_after": live}}
    misses = [("step %d: " % s["step"]) + s["verdict"][len("MISSED: "):]
              for s in steps if s["verdict"] != "ok"]
    row["targets"] = {
        "peaks_every_step": "ok" if not misses else "MISSED: " + "; ".join(misses),
        "same_model": "ok" if same else "FAILED",
    }
    for s in steps:
        log("  %-14s step %d: ebb planned %d B, measured %d B; PyTorch %d B (%.3f)  %s"
            % (name, s["step"], s["ebb_planned"], s["ebb_measured"], s["pytorch"], s["ratio"],
               s["verdict"]))
    return row


def run_all(build, out_dir, log):
    ebb = bench.start_side(build, "ebb_first_steps_bench")
    rows = []
    try:
        for name, spec, batch, what, random in MODELS:
            rows.append(run_model(ebb, out_dir, name, spec, batch, what, random, log))
    finally:
        ebb.close()
    return rows


def table(rows):
    head = ["model", "batch", "step", "ebb planned B", "ebb measured B", "PyTorch B",
            "ebb/PyT", "PyT state made B", "verdict", "check"]
    body = []
    for r in rows:
        for s in r["steps"]:
            body.append([r["model"], str(r["batch"]), str(s["step"]), str(s["ebb_planned"]),
                         str(s["ebb_measured"]), str(s["pytorch"]), "%.3f" % s["ratio"],
                         str(s["pytorch_state_made"]), bench.short(s["verdict"]),
                         bench.short(r["targets"]["same_model"])])
    return head, body


LEGEND = ("Peaks: bytes above the parameters, AdamW state, input and target live when a step "
          "starts; steps from fresh weights and optimizer, the first included. ebb makes AdamW's "
          "state with the optimizer (no step allocates it); PyTorch makes it inside its first "
          "opt.step() ('PyT state made', counted in that step's peak). verdict: ebb measured <= "
          "planned and <= PyTorch. check: the same parameter and optimizer-state bytes, no ebb "
          "step made state, no handle leaked, the losses agree to %g (resnet_small; "
          "mnist_examples' dropout masks differ between the two)" % LOSS_TOL)
