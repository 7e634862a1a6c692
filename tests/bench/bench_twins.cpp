// The hand-written twins. Each mirrors ebb's plan for its spec (see
// `ebb_bench explain`): the ATen calls ebb's ops make, in the plan's order,
// with temporaries released where ebb frees them (at reassignment), as a
// careful libtorch programmer would write it. Parameters are held in plain
// members resolved once at setup, so a forward does nothing but ATen calls.
#include "bench_twins.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <torch/version.h>

namespace bench {
namespace {

// Hands out the parameters in plan order, checking each name's suffix.
class Cursor {
  public:
    explicit Cursor(const NamedParams &p) : p_(p) {}
    at::Tensor next(const char *suffix) {
        if (i_ >= p_.size())
            throw std::runtime_error(std::string("ran out of parameters looking for ") + suffix);
        const std::string &name = p_[i_].first;
        std::string want = std::string(".") + suffix;
        if (name.size() < want.size() || name.compare(name.size() - want.size(), want.size(), want))
            throw std::runtime_error("parameter " + std::to_string(i_) + " is " + name +
                                     ", expected *" + want);
        return p_[i_++].second;
    }
    // The name of the next parameter ("" after the last).
    const std::string &peek() const {
        static const std::string none;
        return i_ < p_.size() ? p_[i_].first : none;
    }
    void done() const {
        if (i_ != p_.size())
            throw std::runtime_error("unused parameter " + p_[i_].first);
    }

  private:
    const NamedParams &p_;
    size_t i_ = 0;
};

struct Linear {
    at::Tensor w, b;
    explicit Linear(Cursor &c) : w(c.next("weight")), b(c.next("bias")) {}
    at::Tensor operator()(const at::Tensor &x) const { return at::linear(x, w, b); }
};

struct LayerNorm {
    at::Tensor w, b;
    explicit LayerNorm(Cursor &c) : w(c.next("weight")), b(c.next("bias")) {}
    // ebb normalises the last dim, passing the input's own trailing size.
    at::Tensor operator()(const at::Tensor &x) const {
        return at::layer_norm(x, x.sizes().slice(static_cast<size_t>(x.dim() - 1)), w, b, 1e-5);
    }
};

long cfg_get(const std::map<std::string, long> &cfg, const char *key, long dflt) {
    auto it = cfg.find(key);
    return it == cfg.end() ? dflt : it->second;
}

// mlp: 5 x (linear -> gelu -> layer_norm).
Forward mlp(Cursor &c) {
    struct Layer {
        Linear fc;
        LayerNorm ln;
    };
    std::vector<Layer> layers;
    for (int i = 0; i < 5; i++) {
        Linear fc(c);
        LayerNorm ln(c);
        layers.push_back({fc, ln});
    }
    return [layers](const at::Tensor &x) {
        at::Tensor h = x;
        for (const Layer &l : layers) {
            h = l.fc(h);
            h = at::gelu(h);
            h = l.ln(h);
        }
        return h;
    };
}

// residual_tower: stem, 12 x (h = h + layer_norm(gelu(linear(h)))), head.
Forward residual_tower(Cursor &c) {
    struct Block {
        Linear fc;
        LayerNorm ln;
    };
    Linear stem(c);
    std::vector<Block> blocks;
    for (int i = 0; i < 12; i++) {
        Linear fc(c);
        LayerNorm ln(c);
        blocks.push_back({fc, ln});
    }
    Linear head(c);
    return [stem, blocks, head](const at::Tensor &x) {
        at::Tensor h = stem(x);
        for (const Block &b : blocks) {
            at::Tensor f = b.fc(h);
            f = at::gelu(f);
            f = b.ln(f);
            h = at::add(h, f);
        }
        return head(h);
    };
}

// gated_routing: a dense gate. Router softmax weights w [B, 8]; expert i's
// output is folded in as it is made: acc = acc + w[:, i:i+1] * y_i.
Forward gated_routing(Cursor &c) {
    struct Expert {
        Linear up, down;
    };
    Linear embed(c), router(c);
    std::vector<Expert> experts;
    for (int i = 0; i < 8; i++) {
        Linear up(c), down(c);
        experts.push_back({up, down});
    }
    Linear head(c);
    return [embed, router, experts, head](const at::Tensor &x) {
        at::Tensor h = embed(x);
        at::Tensor w = at::softmax(router(h), -1);
        at::Tensor acc;
        for (size_t i = 0; i < experts.size(); i++) {
            at::Tensor y = experts[i].up(h);
            y = at::gelu(y);
            y = experts[i].down(y);
            std::vector<int64_t> cs(static_cast<size_t>(y.dim()), 1);
            cs[0] = y.size(0);
            at::Tensor wcol = w.narrow(1, static_cast<int64_t>(i), 1).reshape(cs);
            acc = acc.defined() ? at::addcmul(acc, y, wcol) : at::mul(y, wcol);
        }
        h = at::Tensor();
        return head(acc);
    };
}

// iterative_refine: encode; 8 x (linear -> tanh -> linear), shared; layer_norm; head.
Forward iterative_refine(Cursor &c) {
    Linear encode(c), a(c), b(c);
    LayerNorm ln(c);
    Linear head(c);
    return [encode, a, b, ln, head](const at::Tensor &x) {
        at::Tensor h = encode(x);
        for (int i = 0; i < 8; i++) {
            h = a(h);
            h = at::tanh(h);
            h = b(h);
        }
        h = ln(h);
        return head(h);
    };
}

// feedback: encode -> ctx; until halt (at most 10): state = layer_norm(tanh(linear(state)) + ctx).
// The halting test is ebb's: mean of halt(state) in double, > 0 stops.
Forward feedback(Cursor &c) {
    Linear encode(c), cell(c);
    LayerNorm ln(c);
    Linear halt(c), head(c);
    return [encode, cell, ln, halt, head](const at::Tensor &x) {
        at::Tensor ctx = encode(x);
        at::Tensor state = ctx;
        for (int i = 0; i < 10; i++) {
            at::Tensor s = cell(state);
            s = at::tanh(s);
            s = at::add(s, ctx);
            state = ln(s);
            at::Tensor h = halt(state);
            if (h.to(at::kDouble).mean().item().toDouble() > 0.0)
                break;
        }
        ctx = at::Tensor();
        return head(state);
    };
}

// transformer: embed; 2 post-norm encoder layers. Attention as ebb's
// multi_head_attention: one qkv projection, head split by reshape/permute,
// softmax(q k^T / sqrt(D)) v with matmul on libtorch 1.x, SDPA on 2.x.
// Training adds ebb's spec's two dropouts (p 0.1): on the attention's output
// and after the feed-forward's relu.
Forward transformer(Cursor &c, long heads, bool train) {
    struct Layer {
        at::Tensor in_w, in_b, out_w, out_b;
        LayerNorm ln1;
        Linear ff1, ff2;
        LayerNorm ln2;
    };
    Linear embed(c);
    std::vector<Layer> layers;
    for (int i = 0; i < 2; i++) {
        at::Tensor in_w = c.next("in_proj_weight"), in_b = c.next("in_proj_bias");
        at::Tensor out_w = c.next("out_proj.weight"), out_b = c.next("out_proj.bias");
        LayerNorm ln1(c);
        Linear ff1(c), ff2(c);
        LayerNorm ln2(c);
        layers.push_back({in_w, in_b, out_w, out_b, ln1, ff1, ff2, ln2});
    }
    return [embed, layers, heads, train](const at::Tensor &x) {
        at::Tensor h = embed(x);
        const int64_t B = h.size(0), T = h.size(1), E = h.size(2), H = heads, D = E / heads;
        for (const Layer &l : layers) {
            at::Tensor qkv = at::linear(h, l.in_w, l.in_b).reshape({B, T, 3, H, D}).permute(
                {2, 0, 3, 1, 4});
            at::Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
            qkv = at::Tensor();
#if TORCH_VERSION_MAJOR >= 2
            at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false);
#else
            double scale = 1.0 / std::sqrt(static_cast<double>(D));
            at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
            at::Tensor o = at::matmul(at::softmax(scores, -1), v);
            scores = at::Tensor();
#endif
            q = k = v = at::Tensor();
            o = o.transpose(1, 2).reshape({B, T, E});
            at::Tensor a = at::linear(o, l.out_w, l.out_b);
            o = at::Tensor();
            if (train)
                a = at::dropout(a, 0.1, true);
            h = at::add(h, a);
            a = at::Tensor();
            h = l.ln1(h);
            at::Tensor f = l.ff1(h);
            f = at::relu(f);
            if (train)
                f = at::dropout(f, 0.1, true);
            f = l.ff2(f);
            h = at::add(h, f);
            f = at::Tensor();
            h = l.ln2(h);
        }
        return h;
    };
}

// convnet: 3 x (conv2d 3x3 pad 1 -> batch_norm -> relu), max_pool 2 after the
// first two, adaptive_avg_pool2d(1), flatten, linear. Training normalises by
// the batch's statistics and updates the running ones (momentum 0.1) and the
// batch count, as nn.BatchNorm2d does.
Forward convnet(Cursor &c, bool train) {
    struct Stage {
        at::Tensor cw, cb, bw, bb, rm, rv, nbt;
        bool pool;
    };
    std::vector<Stage> stages;
    for (int i = 0; i < 3; i++) {
        Stage s;
        s.cw = c.next("weight");
        s.cb = c.next("bias");
        s.bw = c.next("weight");
        s.bb = c.next("bias");
        s.rm = c.next("running_mean");
        s.rv = c.next("running_var");
        s.nbt = c.next("num_batches_tracked"); // counted in training only
        s.pool = i < 2;
        stages.push_back(s);
    }
    Linear head(c);
    return [stages, head, train](const at::Tensor &x) {
        at::Tensor h = x;
        for (const Stage &s : stages) {
            h = at::conv2d(h, s.cw, s.cb, {1, 1}, {1, 1}, {1, 1}, 1);
            if (train)
                s.nbt.add_(1);
            h = at::batch_norm(h, s.bw, s.bb, s.rm, s.rv, train, train ? 0.1 : 0.0, 1e-5, true);
            h = at::relu(h);
            if (s.pool)
                h = at::max_pool2d(h, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false);
        }
        h = at::adaptive_avg_pool2d(h, {1, 1});
        h = h.flatten(1, -1);
        return head(h);
    };
}

// gpt: nanoGPT as specs/bench/gpt.yaml. idx [B, T] int64 -> logits [B, T, V].
// Token and position embeddings (added position first, as ebb's plan
// does), pre-norm blocks: c_attn's [B, T, 3d] cut into q, k, v by narrow,
// each split into heads by reshape [B, T, H, D] and transpose [B, H, T, D]
// (views), causal attention (SDPA on libtorch 2.x; on 1.x the scores
// masked above the diagonal, softmax, times v), heads merged by transpose
// and reshape, c_proj, residual; then ln_2, c_fc, gelu, c_proj, residual.
// ln_f, and lm_head tied to wte (its weight, no bias). The forward's gelu
// works in place, its input dying there (the training form keeps it for
// autograd).
Forward gpt(Cursor &c, long heads, bool train) {
    struct Block {
        LayerNorm ln1;
        Linear attn, proj;
        LayerNorm ln2;
        Linear fc, fc_proj;
    };
    at::Tensor wte = c.next("wte.weight"), wpe = c.next("wpe.weight");
    std::vector<Block> blocks;
    while (true) {
        Block b{LayerNorm(c), Linear(c), Linear(c), LayerNorm(c), Linear(c), Linear(c)};
        blocks.push_back(b);
        // the blocks end where ln_f's parameters begin
        if (c.peek().find(".h.") == std::string::npos)
            break;
    }
    LayerNorm ln_f(c);
    return [wte, wpe, blocks, ln_f, heads, train](const at::Tensor &idx) {
        const int64_t B = idx.size(0), T = idx.size(1), E = wte.size(1), H = heads;
        at::Tensor tok = at::embedding(wte, idx);
        at::Tensor pos = at::arange(T, idx.options().dtype(at::kLong));
        at::Tensor x = at::embedding(wpe, pos);
        pos = at::Tensor();
        x = at::add(x, tok);
        tok = at::Tensor();
        for (const Block &b : blocks) {
            at::Tensor h = b.ln1(x);
            at::Tensor qkv = b.attn(h);
            h = at::Tensor();
            at::Tensor q = qkv.narrow(2, 0, E).reshape({B, T, H, -1}).transpose(1, 2);
            at::Tensor k = qkv.narrow(2, E, E).reshape({B, T, H, -1}).transpose(1, 2);
            at::Tensor v = qkv.narrow(2, 2 * E, E).reshape({B, T, H, -1}).transpose(1, 2);
            qkv = at::Tensor();
#if TORCH_VERSION_MAJOR >= 2
            at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true);
#else
            double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
            at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
            at::Tensor above = at::ones({T, T}, idx.options().dtype(at::kBool)).triu_(1);
            scores.masked_fill_(above, -std::numeric_limits<double>::infinity());
            above = at::Tensor();
            scores = at::softmax(scores, -1);
            at::Tensor o = at::matmul(scores, v);
            scores = at::Tensor();
#endif
            q = k = v = at::Tensor();
            o = o.transpose(1, 2).reshape({B, T, E});
            at::Tensor a = b.proj(o);
            o = at::Tensor();
            x = at::add(x, a);
            a = at::Tensor();
            h = b.ln2(x);
            at::Tensor f = b.fc(h);
            h = at::Tensor();
            if (train)
                f = at::gelu(f);
            else
                at::gelu_(f);
            f = b.fc_proj(f);
            x = at::add(x, f);
        }
        x = ln_f(x);
        return at::linear(x, wte);
    };
}

} // namespace

Forward make_twin(const std::string &workload, const NamedParams &params,
                  const std::map<std::string, long> &cfg, bool train) {
    Cursor c(params);
    Forward f;
    if (workload == "mlp")
        f = mlp(c);
    else if (workload == "residual_tower")
        f = residual_tower(c);
    else if (workload == "gated_routing")
        f = gated_routing(c);
    else if (workload == "iterative_refine")
        f = iterative_refine(c);
    else if (workload == "feedback")
        f = feedback(c);
    else if (workload == "transformer")
        f = transformer(c, cfg_get(cfg, "heads", 4), train);
    else if (workload == "convnet")
        f = convnet(c, train);
    else if (workload == "gpt")
        f = gpt(c, cfg_get(cfg, "heads", 4), train);
    else
        throw std::runtime_error("no C++ twin for workload '" + workload + "'");
    c.done();
    return f;
}

} // namespace bench
