#!/usr/bin/python3
"""Computes reference gradients and training runs with PyTorch autograd and
torch.optim, for tests/test_train.c.

Under tests/parity/fixtures/ this writes:

  grad_<model>.safetensors  for every parity model of make_fixtures.py (the
                            same networks, weights and input x, built by its
                            own code), in training mode:
                              <param>          the weights, named as ebb names
                                               them (buffers included)
                              x                the input
                              y                the loss's target: int64 class
                                               indices, or float32 like the output
                              loss             the loss, a float32 scalar
                              grad.<param>     d loss / d param, one per trained
                                               parameter (zeros where autograd
                                               gives None: switch_routed's selector,
                                               which only an argmax reads)
                            and in the header's __metadata__: "loss" (the loss
                            op's name), "loss_attrs" (ebb attribute text, or "")
                            and "zero_grads": the parameters whose gradient is
                            zero in exact arithmetic (a float64 run gives at most
                            1e-12 of the largest gradient), comma-separated. Their
                            float32 gradients are rounding noise (a conv bias
                            before a training batch_norm, which subtracts the
                            batch mean; a selector read only by argmax), so no
                            relative error means anything for them; and, when
                            there are any, "none_grads": those among them that
                            autograd leaves None (no path from the loss at all:
                            the selector), which ebb may leave untrained.

  grad_steps_mlp.safetensors  ten training steps of an 8 -> 16 -> 4 MLP (relu,
                            cross_entropy, batch 6, new data each step) for three
                            optimizers:
                              init.<param>        the initial parameters
                              x.<t>, y.<t>        step t's input and class targets
                              <case>.hp.<name>    the options, float64 scalars as in
                                                  the optim_ fixtures (hp.kind: 0 SGD,
                                                  1 Adam, 2 AdamW)
                              <case>.loss.<t>     the loss at step t (before its update)
                              <case>.final.<param> the parameters after ten steps
                            cases: sgd_momentum (lr 0.1, momentum 0.9), adam and
                            adamw (torch.optim's defaults).

  grad_steps_bn.safetensors   the same for fc1 -> batch_norm (bn1) -> relu -> fc2
                            with SGD + momentum only; init. and final. include
                            bn1's running_mean, running_var and num_batches_tracked
                            (batch_norm in training mode is deterministic).

Dropout cannot be matched (ebb draws its masks from its own seed), so the
"mlp" model's dropout is given p = 0 here; tests/test_train.c compiles its
spec with p: 0.0 for the same reason.

Run with Debian's python3-torch:

    /usr/bin/python3 tests/parity/make_grad_fixtures.py            # everything
    /usr/bin/python3 tests/parity/make_grad_fixtures.py conv_net   # one model
    /usr/bin/python3 tests/parity/make_grad_fixtures.py steps      # the step fixtures

Everything is seeded and float32, so rerunning rewrites the same bytes on the
same PyTorch build. Each model's line reports how far the float32 gradients
are from a float64 run of the same model, for scale.
"""

import copy
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  the models, their seeds and inputs

torch.use_deterministic_algorithms(True)

# model -> (loss op, ebb attribute text, F.<loss> keyword arguments)
LOSSES = {
    "mlp": ("nll", "", {}),  # its output is log_softmax: log-probabilities
    "residual_tower": ("cross_entropy", "", {}),
    "gate8": ("cross_entropy", "label_smoothing=0.1", {"label_smoothing": 0.1}),
    "conv_net": ("cross_entropy", "", {}),
    "transformer_encoder": ("mse", "", {}),
    "transformer_stack": ("mse", "", {}),
    "gru_loop": ("cross_entropy", "", {}),
    "switch_routed": ("cross_entropy", "", {}),
}
TORCH_LOSS = {"nll": F.nll_loss, "cross_entropy": F.cross_entropy, "mse": F.mse_loss}


def write(path, tensors, metadata=None):
    """safetensors with extra __metadata__ strings: make_fixtures' layout
    (names sorted, data 8-byte aligned)."""
    meta = {"format": "pt"}
    meta.update(metadata or {})
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        code, npdt = mf._DTYPES[t.dtype]
        data = t.numpy().astype(npdt, copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def rel(a, b):
    """max|a - b| / max(max|b|, 1e-6): the measure tests/test_train.c uses."""
    return ((a.double() - b.double()).abs().max() / max(b.double().abs().max().item(), 1e-6)).item()


def grads_of(m, x, y, loss_fn, kw):
    """The loss, every parameter's gradient (zeros where autograd has
    None) and the names of those that autograd left None."""
    m.zero_grad(set_to_none=True)
    loss = loss_fn(m(x), y, **kw)
    loss.backward()
    none = [n for n, p in m.named_parameters() if p.grad is None]
    return loss.detach(), {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                           for n, p in m.named_parameters()}, none


def model_fixture(name):
    m, x = mf.build(name)  # seeded as the forward fixtures: the same weights and x
    if name == "mlp":
        m.drop.p = 0.0
    weights = {k: v.detach().clone() for k, v in m.state_dict().items()}
    op, attrs, kw = LOSSES[name]
    loss_fn = TORCH_LOSS[op]
    m.train()
    with torch.no_grad():
        out = m(x)
    m.load_state_dict(weights)  # that forward moved batch_norm's running statistics
    g = torch.Generator().manual_seed(1000 + mf.MODELS[name][2])
    if op in ("nll", "cross_entropy"):
        y = torch.randint(0, out.shape[-1], out.shape[:1], generator=g)
    else:
        y = torch.randn(out.shape, generator=g)
    loss, grads, none = grads_of(m, x, y, loss_fn, kw)

    # float64: for scale, and to tell gradients that are zero in exact arithmetic
    if name == "switch_routed":
        m.last_route = m.last_scores = None  # graph tensors: no deepcopy
    m64 = copy.deepcopy(m)
    m64.load_state_dict(weights)
    m64.double()
    loss64, grads64, _ = grads_of(m64, x.double(), y if y.dtype == torch.int64 else y.double(), loss_fn, kw)
    top64 = max(v.abs().max().item() for v in grads64.values())
    zero = [n for n, v in grads64.items() if v.abs().max().item() <= 1e-12 * top64]
    floor = max(rel(grads[n], grads64[n]) for n in grads if n not in zero)

    tensors = dict(weights)
    tensors.update({"x": x, "y": y, "loss": loss.float()})
    tensors.update({f"grad.{n}": v for n, v in grads.items()})
    path = os.path.join(OUT, f"grad_{name}.safetensors")
    meta = {"loss": op, "loss_attrs": attrs, "zero_grads": ",".join(zero)}
    if none:
        meta["none_grads"] = ",".join(none)
    write(path, tensors, meta)
    print(f"grad_{name}: {op}{'(' + attrs + ')' if attrs else ''} loss {loss.item():.6g}, "
          f"{len(grads)} gradients, float32 vs float64 rel. error {floor:.2e} (loss "
          f"{abs(loss.item() - loss64.item()) / abs(loss64.item()):.1e}), {os.path.getsize(path)} bytes"
          + (f"; zero in exact arithmetic: {', '.join(zero)} (float32 "
             f"{max(grads[n].abs().max().item() for n in zero):.1e})" if zero else ""))


# ---- ten training steps ----------------------------------------------------------

STEPS, BATCH = 10, 6
KINDS = {"SGD": 0, "Adam": 1, "AdamW": 2}


class StepMLP(nn.Module):
    def __init__(self, bn=False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        if bn:
            self.bn1 = nn.BatchNorm1d(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = self.fc1(x)
        if hasattr(self, "bn1"):
            x = self.bn1(x)
        return self.fc2(F.relu(x))


def hp(cls, kw):
    """The options with torch.optim's defaults filled in."""
    d = cls([torch.zeros(1, requires_grad=True)], **kw).defaults
    betas = d.get("betas", (0.0, 0.0))
    return {"kind": KINDS[cls.__name__], "lr": d["lr"], "momentum": d.get("momentum", 0.0),
            "dampening": d.get("dampening", 0.0), "nesterov": float(d.get("nesterov", False)),
            "weight_decay": d["weight_decay"], "beta1": betas[0], "beta2": betas[1],
            "eps": d.get("eps", 0.0), "amsgrad": float(d.get("amsgrad", False))}


def steps_fixture(fname, bn, cases, seed):
    torch.manual_seed(seed)
    m = StepMLP(bn)
    if bn:
        with torch.no_grad():
            m.bn1.weight.uniform_(0.5, 1.5)
            m.bn1.bias.uniform_(-0.5, 0.5)
    init = {k: v.detach().clone() for k, v in m.state_dict().items()}
    g = torch.Generator().manual_seed(seed + 1)
    data = [(torch.randn(BATCH, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g))
            for _ in range(STEPS)]
    out = {f"init.{k}": v for k, v in init.items()}
    for t, (x, y) in enumerate(data):
        out[f"x.{t}"], out[f"y.{t}"] = x, y
    for case, (cls, kw) in cases.items():
        m.load_state_dict(init)
        m.train()
        opt = cls(m.parameters(), foreach=False, **kw)
        for t, (x, y) in enumerate(data):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            out[f"{case}.loss.{t}"] = loss.detach().float()
        for k, v in m.state_dict().items():
            out[f"{case}.final.{k}"] = v.detach().clone()
        for k, v in hp(cls, kw).items():
            out[f"{case}.hp.{k}"] = torch.tensor(float(v), dtype=torch.float64)
        moved = max((m.state_dict()[k].double() - init[k].double()).abs().max().item()
                    for k in init if init[k].is_floating_point())
        print(f"{fname} {case}: losses {out[f'{case}.loss.0'].item():.4f} -> "
              f"{out[f'{case}.loss.{STEPS - 1}'].item():.4f}, largest change {moved:.3g}")
    path = os.path.join(OUT, f"{fname}.safetensors")
    write(path, out)
    print(f"{fname}: {os.path.getsize(path)} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    names = sys.argv[1:] or list(mf.MODELS) + ["steps"]
    for name in names:
        if name == "steps":
            steps_fixture("grad_steps_mlp", False, {
                "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                "adam": (torch.optim.Adam, {}),
                "adamw": (torch.optim.AdamW, {}),
            }, seed=11)
            steps_fixture("grad_steps_bn", True, {
                "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
            }, seed=12)
        elif name in mf.MODELS:
            model_fixture(name)
        else:
            sys.exit(f"unknown fixture '{name}': one of {', '.join(list(mf.MODELS) + ['steps'])}")


if __name__ == "__main__":
    main()
