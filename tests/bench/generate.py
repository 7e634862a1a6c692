"""Generation through a key/value cache, ebb against PyTorch eager (issue 46,
part 4): greedy decoding at batch 1 on the CPU, a prompt of PROMPT tokens
then NEW tokens, each the most likely next one fed back, for

- specs/llama.yaml: rotary embeddings, grouped-query attention (the cache
  holds the key/value heads before they are repeated), a SwiGLU MLP;
- specs/gpt.yaml: nanoGPT, learned positions, a GELU MLP, tied lm_head.

ebb runs as `ebb generate` does (ebb_generate_bench: a plan for the prompt
and one for each next token sharing one ebb_kv_cache). PyTorch runs the same
model with the cache users write for it, Hugging Face's DynamicCache way:
each layer's keys and values (before repeat_kv) concatenated onto the
cache's with torch.cat at every step, attention by
F.scaled_dot_product_attention (on torch 1.13, which lacks it, nanoGPT's own
matmul, mask and softmax), under torch.inference_mode(). Both start
from ebb's initial weights (exported by the ebb side) and must give the same
tokens.

Rows: per model, the decode rate (tokens per second over the NEW - 1 decode
steps, the median over PAIRS generations a side) and the prompt's time,
ebb's cache bytes, its next-token plan's peak against the most a step
measured. The two sides take turns a generation each (which goes first
alternating), and the ratio is the median of each turn's ebb/PyTorch: a
busy machine slows both sides of a turn alike. Target G1: that ratio >= 1.5.

Run through run.py (`bash tests/bench/run.sh BUILD --only generate`), which
sets the threads before torch loads.
"""
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

import run as bench  # Ebb, load_export, short

PROMPT, NEW = 32, 96
PAIRS = 15              # turns: one generation each side, the first side alternating
TARGET = 1.5            # G1: ebb decode tokens/s >= 1.5x PyTorch eager's
# (name, spec, params, what)
MODELS = [
    ("llama", "specs/llama.yaml",
     {"layers": 4, "d": 256, "heads": 8, "kv_heads": 4, "hidden": 688},
     "4 layers, d 256, 8 heads over 4 kv heads, SwiGLU 688, vocab 256"),
    ("gpt", "specs/gpt.yaml",
     {"layers": 4, "d": 256, "heads": 8, "block": PROMPT + NEW},
     "nanoGPT: 4 layers, d 256, 8 heads, GELU 1024, vocab 256"),
]


def attention(q, k, v, causal):
    """F.scaled_dot_product_attention where torch has it (2.x); on 1.13
    nanoGPT's own path: the scores masked by a lower triangle, softmax, v."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
    if causal:
        t, n = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(t, n, dtype=torch.bool).tril(n - t).logical_not(),
                          float("-inf"))
    return F.softmax(s, dim=-1) @ v


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Llama:
    """LlamaForCausalLM's forward with a DynamicCache, from its state_dict."""

    def __init__(self, sd, p, positions):
        self.sd, self.p = sd, p
        self.hd = p["d"] // p["heads"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
        emb = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()

    def __call__(self, idx, cache):
        sd, p, hd = self.sd, self.p, self.hd
        b, t = idx.shape
        start = cache[0][0].shape[2] if cache[0] is not None else 0
        cos, sin = self.cos[start:start + t], self.sin[start:start + t]
        x = F.embedding(idx, sd["model.embed_tokens.weight"])
        for i in range(p["layers"]):
            pre = "model.layers.%d." % i
            h = rms_norm(x, sd[pre + "input_layernorm.weight"], 1e-5)
            q = F.linear(h, sd[pre + "self_attn.q_proj.weight"]).view(b, t, p["heads"], hd)
            k = F.linear(h, sd[pre + "self_attn.k_proj.weight"]).view(b, t, p["kv_heads"], hd)
            v = F.linear(h, sd[pre + "self_attn.v_proj.weight"]).view(b, t, p["kv_heads"], hd)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            cache[i] = (k, v)
            rep = p["heads"] // p["kv_heads"]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            a = attention(q, k, v, t > 1)
            a = a.transpose(1, 2).reshape(b, t, p["d"])
            x = x + F.linear(a, sd[pre + "self_attn.o_proj.weight"])
            h = rms_norm(x, sd[pre + "post_attention_layernorm.weight"], 1e-5)
            g = F.silu(F.linear(h, sd[pre + "mlp.gate_proj.weight"]))
            u = F.linear(h, sd[pre + "mlp.up_proj.weight"])
            x = x + F.linear(g * u, sd[pre + "mlp.down_proj.weight"])
        x = rms_norm(x, sd["model.norm.weight"], 1e-5)
        return F.linear(x[:, -1:], sd["lm_head.weight"])


class Gpt:
    """nanoGPT's forward with a key/value cache, from its state_dict."""

    def __init__(self, sd, p, positions):
        self.sd, self.p = sd, p

    def __call__(self, idx, cache):
        sd, p = self.sd, self.p
        b, t = idx.shape
        d, nh = p["d"], p["heads"]
        start = cache[0][0].shape[2] if cache[0] is not None else 0
        pos = torch.arange(start, start + t)
        x = F.embedding(idx, sd["transformer.wte.weight"]) + \
            F.embedding(pos, sd["transformer.wpe.weight"])
        for i in range(p["layers"]):
            pre = "transformer.h.%d." % i
            h = F.layer_norm(x, (d,), sd[pre + "ln_1.weight"], sd[pre + "ln_1.bias"])
            qkv = F.linear(h, sd[pre + "attn.c_attn.weight"], sd[pre + "attn.c_attn.bias"])
            q, k, v = qkv.split(d, dim=2)
            q = q.view(b, t, nh, d // nh).transpose(1, 2)
            k = k.view(b, t, nh, d // nh).transpose(1, 2)
            v = v.view(b, t, nh, d // nh).transpose(1, 2)
            if cache[i] is not None:
                k = torch.cat((cache[i][0], k), dim=2)
                v = torch.cat((cache[i][1], v), dim=2)
            cache[i] = (k, v)
            a = attention(q, k, v, t > 1)
            a = a.transpose(1, 2).reshape(b, t, d)
            x = x + F.linear(a, sd[pre + "attn.c_proj.weight"], sd[pre + "attn.c_proj.bias"])
            h = F.layer_norm(x, (d,), sd[pre + "ln_2.weight"], sd[pre + "ln_2.bias"])
            h = F.gelu(F.linear(h, sd[pre + "mlp.c_fc.weight"], sd[pre + "mlp.c_fc.bias"]))
            x = x + F.linear(h, sd[pre + "mlp.c_proj.weight"], sd[pre + "mlp.c_proj.bias"])
        x = F.layer_norm(x, (d,), sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"])
        return F.linear(x[:, -1:], sd["transformer.wte.weight"])


def clock():
    return time.thread_time() if bench.CLOCK == "cpu" else time.perf_counter()


@torch.inference_mode()
def torch_round(model, layers, vocab):
    """One greedy generation: the prompt's seconds, the decode's, the tokens."""
    idx = torch.tensor([[(37 * i + 11) % vocab for i in range(PROMPT)]])
    cache = [None] * layers
    t0 = clock()
    nxt = model(idx, cache).argmax(-1)
    t1 = clock()
    toks = [nxt]
    for _ in range(NEW - 1):
        nxt = model(nxt, cache).argmax(-1)
        toks.append(nxt)
    t2 = clock()
    return t1 - t0, t2 - t1, [int(x) for x in torch.cat(toks, dim=1)[0]]


def run_model(ebb, out_dir, name, spec, params, what, log):
    prefix = os.path.join(out_dir, "generate_" + name)
    info = ebb.ask("setup", os.path.join(bench.ROOT, spec), PROMPT, NEW, prefix,
                   *("%s=%s" % kv for kv in params.items()))
    sd = dict(bench.load_export(prefix))
    cls = Llama if name == "llama" else Gpt
    model = cls(sd, params, PROMPT + NEW)
    ebb_prompt, ebb_decode, torch_prompt, torch_decode, ratios = [], [], [], [], []
    ebb_tokens = torch_tokens = None
    measured = 0
    for turn in range(PAIRS):
        for side in ((0, 1) if turn % 2 == 0 else (1, 0)):
            if side == 0:
                r = ebb.ask("generate", 1)
                ebb_prompt += r["prompt_s_" + bench.CLOCK]
                ebb_decode += r["decode_s_" + bench.CLOCK]
                ebb_tokens = r["tokens"]
                measured = max(measured, r["next_measured"])
            else:
                tp, td, torch_tokens = torch_round(model, params["layers"], info["vocab"])
                torch_prompt.append(tp)
                torch_decode.append(td)
        ratios.append(torch_decode[-1] / ebb_decode[-1])
    steps = NEW - 1
    ebb_rate = steps / statistics.median(ebb_decode)
    torch_rate = steps / statistics.median(torch_decode)
    ratio = statistics.median(ratios)
    same = ebb_tokens == torch_tokens
    first_diff = next((k for k, (a, b) in enumerate(zip(ebb_tokens, torch_tokens)) if a != b),
                      None)
    row = {"model": name, "what": what, "prompt": PROMPT, "new": NEW,
           "ebb_tok_s": ebb_rate, "torch_tok_s": torch_rate, "ratio": ratio,
           "ratio_min": min(ratios), "ratio_max": max(ratios),
           "ebb_prompt_ms": 1e3 * statistics.median(ebb_prompt),
           "torch_prompt_ms": 1e3 * statistics.median(torch_prompt),
           "cache_bytes": info["cache_bytes"], "next_planned": info["next_planned"],
           "next_measured": measured,
           "targets": {"G1": "ok" if ratio >= TARGET else "MISSED",
                       "same_tokens": "ok" if same else "FAILED",
                       "within_plan": "ok" if measured <= info["next_planned"] else "FAILED"}}
    log("  generate %-6s ebb %.0f tok/s, PyTorch %.0f tok/s (%.2fx); tokens %s%s" %
        (name, ebb_rate, torch_rate, row["ratio"], "the same" if same else "DIFFER",
         "" if same else " from %s" % first_diff))
    return row


def run_all(build, out_dir, log):
    ebb = bench.start_side(build, "ebb_generate_bench")
    rows = []
    try:
        for name, spec, params, what in MODELS:
            rows.append(run_model(ebb, out_dir, name, spec, params, what, log))
    finally:
        ebb.close()
    return rows


def table(rows):
    head = ["model", "prompt+new", "ebb tok/s", "PyTorch tok/s", "ebb/PyT [min, max]",
            "ebb prompt ms",
            "PyT prompt ms", "cache B", "next planned B", "next measured B", "G1 >=1.5x",
            "tokens", "m<=p"]
    body = []
    for r in rows:
        t = r["targets"]
        body.append([r["model"], "%d+%d" % (r["prompt"], r["new"]), "%.0f" % r["ebb_tok_s"],
                     "%.0f" % r["torch_tok_s"],
                     "%.2f [%.2f, %.2f]" % (r["ratio"], r["ratio_min"], r["ratio_max"]),
                     "%.2f" % r["ebb_prompt_ms"], "%.2f" % r["torch_prompt_ms"],
                     str(r["cache_bytes"]), str(r["next_planned"]), str(r["next_measured"]),
                     bench.short(t["G1"]), bench.short(t["same_tokens"]),
                     bench.short(t["within_plan"])])
    return head, body


LEGEND = ("Greedy decoding at batch 1, one thread: tokens/s over the %d decode steps after "
          "the prompt (median of %d generations a side); ebb/PyT: the median of the turns' "
          "ratios (a generation each side a turn, the first alternating). ebb: the "
          "prompt's plan and the next token's plan sharing an ebb_kv_cache; PyTorch eager: the "
          "same weights, each layer's keys and values torch.cat onto its cache (Hugging Face's "
          "DynamicCache), F.scaled_dot_product_attention, inference_mode. G1: ebb >= %.1fx "
          "PyTorch's rate. tokens: both generate the same tokens. m<=p: no next-token run "
          "measured above its plan's peak (a bound: counted at a full cache)"
          % (NEW - 1, PAIRS, TARGET))
