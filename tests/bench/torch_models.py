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


class CausalSelfAttention(nn.Module):
    """nanoGPT's CausalSelfAttention (dropout 0): one fused c_attn split into
    q, k, v, heads by view and transpose, causal attention, c_proj. On
    torch 2.x F.scaled_dot_product_attention(is_causal=True), as nanoGPT's
    flash path; on 1.13, which has none, nanoGPT's written-out path with its
    lower-triangular mask buffer."""

    def __init__(self, d, heads, block):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.flash = hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            self.register_buffer("bias", torch.tril(torch.ones(block, block))
                                 .view(1, 1, block, block), persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                               is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, block)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = GPTMLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (model.py, dropout 0, biases on): token and position
    embeddings, the blocks, ln_f, and lm_head tied to transformer.wte (one
    tensor under both state_dict keys). It returns the logits of every
    position (nanoGPT's inference path keeps only the last one); the
    training loss is per token, F.cross_entropy(logits.view(-1, V),
    y.view(-1)) (run.py's loss_fn)."""

    takes_indices = True  # idx is int64 token ids

    def __init__(self, vocab, block, layers, heads, d):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
            h=nn.ModuleList([GPTBlock(d, heads, block) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def ebb_names(self):
        """nanoGPT's state_dict keys in ebb's plan order (the tied weight once,
        as transformer.wte.weight)."""
        names = ["transformer.wte.weight", "transformer.wpe.weight"]
        for i in range(len(self.transformer.h)):
            names += ["transformer.h.%d.%s.%s" % (i, m, p)
                      for m in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc",
                                "mlp.c_proj") for p in ("weight", "bias")]
        return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]

    def ebb_order(self):
        return [self.get_parameter(n) for n in self.ebb_names()]


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
    if workload == "gpt":
        return GPT(p["vocab"], p["block"], p["layers"], p["heads"], p["d"])
    raise ValueError("no PyTorch twin for " + workload)
