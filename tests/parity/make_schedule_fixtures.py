#!/usr/bin/python3
"""Steps torch.optim.lr_scheduler's schedulers and writes the rates they set.

tests/test_optim.c makes ebb's scheduler of each schedule below (by its text
form, ebb_lr_schedule_parse) over an optimizer with learning rate 0.1, and
compares its rate before every step with PyTorch's. Under
tests/parity/fixtures/ this writes:

  lr_schedules.safetensors   one float64 tensor [STEPS] per schedule, named by
                             its text form: the optimizer's learning rate
                             for steps 0 .. STEPS - 1 (after 0 .. STEPS - 1
                             calls of scheduler.step())

Run with Debian's python3-torch:

    /usr/bin/python3 tests/parity/make_schedule_fixtures.py

Nothing is random. --out DIR writes there (--replay DIR is accepted and
changes nothing), as the other fixture scripts.
"""

import math
import os
import sys

import torch
from torch.optim import lr_scheduler as sched

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402
from make_fixtures import save_safetensors  # noqa: E402

STEPS = 100
BASE_LR = 0.1


def warmup_cosine(warmup, total):
    """transformers' get_cosine_schedule_with_warmup (num_cycles 0.5)."""
    def factor(step):
        if step < warmup:
            return float(step) / float(max(1, warmup))
        progress = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(0.5) * 2.0 * progress)))
    return factor


def warmup_cosine_min(warmup, total, min_lr):
    """The cosine down to min_lr at total and min_lr after (nanoGPT's
    get_lr, past its warmup), as a factor of BASE_LR."""
    cosine = warmup_cosine(warmup, total)

    def factor(step):
        if step < warmup:
            return cosine(step)
        f = cosine(min(step, total))
        return (min_lr + f * (BASE_LR - min_lr)) / BASE_LR
    return factor


# ebb's text form: a function making PyTorch's scheduler of an optimizer
SCHEDULES = {
    "step:7:0.5": lambda o: sched.StepLR(o, 7, gamma=0.5),
    "step:10": lambda o: sched.StepLR(o, 10),
    "multistep:5,12,30:0.3": lambda o: sched.MultiStepLR(o, [5, 12, 30], gamma=0.3),
    "exponential:0.97": lambda o: sched.ExponentialLR(o, 0.97),
    "cosine:25": lambda o: sched.CosineAnnealingLR(o, 25),
    "cosine:40:0.001": lambda o: sched.CosineAnnealingLR(o, 40, eta_min=0.001),
    "linear:10": lambda o: sched.LinearLR(o, total_iters=10),
    "linear:20:0.1:0.9": lambda o: sched.LinearLR(o, start_factor=0.1, end_factor=0.9,
                                                  total_iters=20),
    "warmup-cosine:10:100": lambda o: sched.LambdaLR(o, warmup_cosine(10, 100)),
    "warmup-cosine:0:60": lambda o: sched.LambdaLR(o, warmup_cosine(0, 60)),
    "warmup-cosine:10:60:0.01": lambda o: sched.LambdaLR(o, warmup_cosine_min(10, 60, 0.01)),
    "onecycle:0.5:100": lambda o: sched.OneCycleLR(o, 0.5, total_steps=100,
                                                   cycle_momentum=False),
    "onecycle:0.05:120:0.25": lambda o: sched.OneCycleLR(o, 0.05, total_steps=120,
                                                         pct_start=0.25, cycle_momentum=False),
}


def rates(make):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=BASE_LR)
    s = make(opt)
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return torch.tensor(out, dtype=torch.float64)


def main():
    out, _extra = mf.parse_args(sys.argv[1:])
    os.makedirs(out, exist_ok=True)
    tensors = {text: rates(make) for text, make in SCHEDULES.items()}
    path = os.path.join(out, "lr_schedules.safetensors")
    save_safetensors(path, tensors)
    print(f"lr_schedules: {len(tensors)} schedules of {STEPS} steps, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
