#!/usr/bin/python3
"""Runs torch.optim on a small MLP and writes the optimizer fixtures.

tests/test_optim.c replays the same gradients through ebb's optimizers and
compares every step's parameters with torch.optim's. Under
tests/parity/fixtures/ this writes:

  optim_mlp.params.safetensors   the MLP's initial parameters (fc1.weight [16, 8],
                                 fc1.bias [16], fc2.weight [4, 16], fc2.bias [4])
  optim_mlp.grads.safetensors    grad.<t>.<param> for steps t = 0..9; a missing
                                 entry is a parameter whose .grad was None
  optim_<case>.safetensors       for each case below:
                                   hp.<name>            the options, float64 scalars
                                                        (hp.kind: 0 SGD, 1 Adam, 2 AdamW, 3 RMSprop,
                                                        4 Adagrad, 5 Adadelta)
                                   after.<t>.<param>    the parameters after step t
                                   optim.<param>.<state>, optim.<param>.step,
                                   optim.options        torch.optim's state after the last
                                                        step, named and laid out as
                                                        ebb_optimizer_save() writes it

Run with Debian's python3-torch (the interpreter matters: a pyenv python
usually has no torch):

    /usr/bin/python3 tests/parity/make_optim_fixtures.py

Everything is seeded, so rerunning rewrites the same bytes on the same
PyTorch build. --out DIR and --replay DIR work as in make_fixtures.py
(--replay takes the initial parameters and the gradients from DIR's
optim_mlp.*.safetensors). foreach=False pins torch.optim's single-tensor code paths,
which are the ones ebb follows.
"""

import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402
from make_fixtures import save_safetensors  # noqa: E402

STEPS = 10
# (step, parameter) pairs whose gradient is None: torch.optim skips them, so
# their state is created late (fc1.bias) or not advanced (fc2.bias).
SKIPPED = {(0, "fc1.bias"), (4, "fc2.bias")}
KINDS = {"SGD": 0, "Adam": 1, "AdamW": 2, "RMSprop": 3, "Adagrad": 4, "Adadelta": 5}
SLOTS = ("momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg",
         "grad_avg", "acc_delta", "sum")

# name: (torch.optim class, its keyword arguments)
CASES = {
    "sgd": ("SGD", dict(lr=0.1)),
    "sgd_momentum": ("SGD", dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov_wd": ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "sgd_dampening_wd": ("SGD", dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=1e-3)),
    "adam_wd": ("Adam", dict(lr=1e-2, weight_decay=1e-2)),
    "adam_amsgrad": ("Adam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, amsgrad=True)),
    "adamw": ("AdamW", dict(lr=1e-2)),
    "adamw_amsgrad": ("AdamW", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    "rmsprop": ("RMSprop", dict()),
    "rmsprop_centered_momentum": ("RMSprop", dict(lr=1e-3, alpha=0.9, eps=1e-6, momentum=0.9,
                                                  centered=True, weight_decay=1e-2)),
    "adagrad": ("Adagrad", dict(lr=0.1)),
    "adagrad_decay": ("Adagrad", dict(lr=0.5, lr_decay=0.1, weight_decay=1e-2,
                                      initial_accumulator_value=0.1, eps=1e-8)),
    "adadelta": ("Adadelta", dict()),
    "adadelta_wd": ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=1e-2)),
}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)


def initial_params():
    torch.manual_seed(0)
    return {n: p.detach().clone() for n, p in MLP().named_parameters()}


def gradients(params):
    """STEPS gradient sets of varied scale: most near 1e-1, one step tiny
    (1e-7) and one large (10). fc2.bias's are 1e-7 times smaller throughout,
    so that Adam's eps (1e-8) weighs in its denominator."""
    g = torch.Generator().manual_seed(1234)
    scales = [0.1, 0.3, 0.05, 1.0, 0.1, 1e-7, 0.2, 10.0, 0.02, 0.1]
    out = []
    for t in range(STEPS):
        step = {}
        for n, p in params.items():
            if (t, n) not in SKIPPED:
                tiny = 1e-7 if n == "fc2.bias" else 1.0
                step[n] = torch.randn(p.shape, generator=g) * scales[t] * tiny
        out.append(step)
    return out


def hyperparameters(kind, kw):
    """The options as ebb resolves them: torch.optim's defaults filled in."""
    cls = getattr(torch.optim, kind)
    defaults = cls([torch.zeros(1, requires_grad=True)], **kw).defaults
    betas = defaults.get("betas", (0.0, 0.0))
    return {
        "kind": KINDS[kind],
        "lr": defaults["lr"],
        "momentum": defaults.get("momentum", 0.0),
        "dampening": defaults.get("dampening", 0.0),
        "nesterov": float(defaults.get("nesterov", False)),
        "weight_decay": defaults["weight_decay"],
        "beta1": betas[0],
        "beta2": betas[1],
        "eps": defaults.get("eps", 0.0),
        "amsgrad": float(defaults.get("amsgrad", False)),
        # RMSprop's alpha and Adadelta's rho are ebb's rho
        "rho": defaults.get("alpha", defaults.get("rho", 0.0)),
        "centered": float(defaults.get("centered", False)),
        "lr_decay": defaults.get("lr_decay", 0.0),
        "initial_accumulator_value": defaults.get("initial_accumulator_value", 0.0),
    }


def run_case(kind, kw, init, grads):
    params = {n: nn.Parameter(t.clone()) for n, t in init.items()}
    opt = getattr(torch.optim, kind)(list(params.values()), foreach=False, **kw)
    updates = {n: 0 for n in params}
    out = {}
    for t, step in enumerate(grads):
        for n, p in params.items():
            p.grad = step[n].clone() if n in step else None
            updates[n] += n in step
        opt.step()
        for n, p in params.items():
            out[f"after.{t}.{n}"] = p.detach().clone()

    hp = hyperparameters(kind, kw)
    for k, v in hp.items():
        out[f"hp.{k}"] = torch.tensor(float(v), dtype=torch.float64)
    out["optim.options"] = torch.tensor(
        [2, hp["kind"], hp["lr"], hp["momentum"], hp["dampening"], hp["nesterov"],
         hp["weight_decay"], hp["beta1"], hp["beta2"], hp["eps"], hp["amsgrad"], hp["rho"],
         hp["centered"], hp["lr_decay"], hp["initial_accumulator_value"]],
        dtype=torch.float64)
    for n, p in params.items():
        st = opt.state.get(p, {})
        if not updates[n]:  # never updated: no state in ebb either
            assert not st, (n, st)
            continue
        for key in SLOTS:
            if st.get(key) is not None:
                out[f"optim.{n}.{key}"] = st[key].detach().clone()
        # SGD keeps no step of its own (and torch 2.x's SGD without momentum
        # no state at all); ebb counts updates for every kind.
        step = float(st["step"]) if "step" in st else float(updates[n])
        assert step == updates[n], (n, step, updates[n])
        out[f"optim.{n}.step"] = torch.tensor(step, dtype=torch.float64)
    return out


def main():
    global OUT
    OUT, extra = mf.parse_args(sys.argv[1:])
    if extra:
        sys.exit(f"make_optim_fixtures.py takes only --out DIR and --replay DIR, not {' '.join(extra)}")
    os.makedirs(OUT, exist_ok=True)
    init = mf.replayed("optim_mlp.params.safetensors", initial_params())
    grads = gradients(init)
    if mf.REPLAY:
        saved = mf.replayed("optim_mlp.grads.safetensors",
                            {f"grad.{t}.{n}": g for t, step in enumerate(grads) for n, g in step.items()})
        grads = [{n: saved[f"grad.{t}.{n}"] for n in step} for t, step in enumerate(grads)]
    save_safetensors(os.path.join(OUT, "optim_mlp.params.safetensors"), init)
    save_safetensors(os.path.join(OUT, "optim_mlp.grads.safetensors"),
                     {f"grad.{t}.{n}": g for t, step in enumerate(grads) for n, g in step.items()})
    for case, (kind, kw) in CASES.items():
        out = run_case(kind, kw, init, grads)
        path = os.path.join(OUT, f"optim_{case}.safetensors")
        save_safetensors(path, out)
        moved = max((out[f"after.{STEPS - 1}.{n}"] - init[n]).abs().max().item() for n in init)
        print(f"{case:18s} {kind:5s} {os.path.getsize(path):6d} bytes, largest change {moved:.3g}")


if __name__ == "__main__":
    main()
