"""PyTorch eager twins of the bench workloads: plain nn.Modules of the same
architecture, written as a PyTorch user would write them. Each module also
lists its parameters in ebb's plan order (ebb_order), so the values ebb
exported can be copied in and the outputs compared."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _lin(m):
    return [m.weight, m.bias]


class MLP(nn.Module):
    """5 x (linear -> gelu -> layer_norm)."""

    def __init__(self, d):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d)) for _ in range(5))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def ebb_order(self):
        return [p for l in self.layers for p in _lin(l[0]) + _lin(l[2])]


class ResidualTower(nn.Module):
    """stem, 12 x (h + layer_norm(gelu(linear(h)))), head."""

    def __init__(self, d):
        super().__init__()
        self.stem = nn.Linear(d, d)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d)) for _ in range(12))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)

    def ebb_order(self):
        ps = _lin(self.stem)
        for b in self.blocks:
            ps += _lin(b[0]) + _lin(b[2])
        return ps + _lin(self.head)


class GatedRouting(nn.Module):
    """A dense (soft) gate over 8 feed-forward experts, each expert's output
    weighted and summed as it is made."""

    def __init__(self, d, hidden):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.router = nn.Linear(d, 8)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)) for _ in range(8))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.embed(x)
        w = F.softmax(self.router(h), dim=-1)
        acc = None
        for i, expert in enumerate(self.experts):
            y = expert(h) * w[:, i:i + 1]
            acc = y if acc is None else acc + y
        return self.head(acc)

    def ebb_order(self):
        ps = _lin(self.embed) + _lin(self.router)
        for e in self.experts:
            ps += _lin(e[0]) + _lin(e[2])
        return ps + _lin(self.head)


class IterativeRefine(nn.Module):
    """encode; one shared (linear -> tanh -> linear) applied 8 times; layer_norm; head."""

    def __init__(self, d):
        super().__init__()
        self.encode = nn.Linear(d, d)
        self.refine = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.encode(x)
        for _ in range(8):
            h = self.refine(h)
        return self.head(self.norm(h))

    def ebb_order(self):
        return (_lin(self.encode) + _lin(self.refine[0]) + _lin(self.refine[2]) +
                _lin(self.norm) + _lin(self.head))


class Feedback(nn.Module):
    """encode -> ctx; repeat state = layer_norm(tanh(linear(state)) + ctx)
    until a learned halting head's mean is > 0, at most 10 times; head."""

    def __init__(self, d):
        super().__init__()
        self.encode = nn.Linear(d, d)
        self.cell = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.halt = nn.Linear(d, 1)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        ctx = self.encode(x)
        state = ctx
        for _ in range(10):
            state = self.norm(torch.tanh(self.cell(state)) + ctx)
            if self.halt(state).mean().item() > 0:
                break
        return self.head(state)

    def ebb_order(self):
        return (_lin(self.encode) + _lin(self.cell) + _lin(self.norm) + _lin(self.halt) +
                _lin(self.head))


class Transformer(nn.Module):
    """embed; 2 x nn.TransformerEncoderLayer (post-norm, relu, batch_first).

    For training (ebb_dropouts) the layers drop what ebb's spec drops and no
    more: the attention's output and the feed-forward's hidden units, p 0.1.
    nn.TransformerEncoderLayer would also drop the attention probabilities
    and the feed-forward's output, work the other two engines do not do."""

    def __init__(self, d, heads, ff, ebb_dropouts=False):
        super().__init__()
        self.embed = nn.Linear(d, d)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, batch_first=True)
            for _ in range(2))
        if ebb_dropouts:
            for layer in self.layers:
                layer.self_attn.dropout = 0.0
                layer.dropout2 = nn.Identity()

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return h

    def ebb_order(self):
        ps = _lin(self.embed)
        for l in self.layers:
            a = l.self_attn
            ps += [a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias]
            ps += _lin(l.norm1) + _lin(l.linear1) + _lin(l.linear2) + _lin(l.norm2)
        return ps


class ConvNet(nn.Module):
    """3 x (conv3x3 -> batch_norm -> relu), max-pooled after the first two;
    global average pooling; linear."""

    def __init__(self, c, c2):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c2, c2, 3, padding=1), nn.BatchNorm2d(c2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c2, 10))

    def forward(self, x):
        return self.net(x)

    def ebb_order(self):
        ps = []
        for i in (0, 4, 8):
            conv, bn = self.net[i], self.net[i + 1]
            ps += _lin(conv) + [bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                   bn.num_batches_tracked]
        return ps + _lin(self.net[13])


def build(workload, params, train=False):
    """The module for a workload, given the spec's params ({'d': 64, ...});
    with train, the form whose training step matches ebb's spec."""
    p = params
    if workload == "mlp":
        return MLP(p["d"])
    if workload == "residual_tower":
        return ResidualTower(p["d"])
    if workload == "gated_routing":
        return GatedRouting(p["d"], p["hidden"])
    if workload == "iterative_refine":
        return IterativeRefine(p["d"])
    if workload == "feedback":
        return Feedback(p["d"])
    if workload == "transformer":
        return Transformer(p["d"], p["heads"], p["ff"], ebb_dropouts=train)
    if workload == "convnet":
        return ConvNet(p["c"], p["c2"])
    raise ValueError("no PyTorch twin for " + workload)
