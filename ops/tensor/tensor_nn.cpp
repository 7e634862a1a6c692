// The tensor layer's neural-network primitives: convolution, pooling,
// normalisation, embedding, attention and recurrent cells, plus copying host
// bytes into an existing tensor. Same rules as tensor.cpp: every call runs
// inside EBB_TRY, no exception escapes, and a failure names both shapes.
//
// Two things are added on top of ATen:
//  - meta tensors: where libtorch 1.13 has no meta kernel (convolution,
//    batch/group norm, embedding, adaptive pooling), or its meta path would
//    allocate on the CPU (rms_norm's scalar), the output shape is computed
//    here, so the compiler's dry run allocates nothing real;
//  - float16 on the CPU: libtorch 1.13 implements almost none of these for
//    Half on the CPU. When it refuses, the call is repeated in float32 and the
//    result cast back to float16.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <torch/version.h>

#include "internal.h"
#include "shim.hpp"

using ebb::wrap;

namespace ebb {

bool flash_takes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v) {
#if EBB_FLASH_ATTENTION
    return q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == k.size(0) &&
           k.size(0) == v.size(0) && q.size(1) == k.size(1) && k.size(1) == v.size(1) &&
           q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1 &&
           q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() &&
           ebb_attention_fused(from_aten(q.scalar_type()), q.size(-1), v.size(-1), q.size(2),
                               k.size(2));
#else
    (void)q, (void)k, (void)v;
    return false;
#endif
}

} // namespace ebb

namespace {


using ebb::dims;
std::string dims(const ebb_tensor *t) { return t ? dims(t->t) : std::string("(none)"); }

bool is_meta(const at::Tensor &t) { return t.device().type() == at::kMeta; }


// A float16 CPU tensor in float32 when `up` is set; anything else unchanged.
at::Tensor up(const at::Tensor &t, bool upcast) {
    return upcast && t.defined() && t.scalar_type() == at::kHalf ? t.to(at::kFloat) : t;
}

c10::optional<at::Tensor> up(const ebb_tensor *t, bool upcast) {
    if (t)
        return up(t->t, upcast);
    return c10::nullopt;
}

at::Tensor to_half(at::Tensor t) { return t.to(at::kHalf); }
std::tuple<at::Tensor, at::Tensor> to_half(std::tuple<at::Tensor, at::Tensor> t) {
    return {std::get<0>(t).to(at::kHalf), std::get<1>(t).to(at::kHalf)};
}

// Runs `run(false)`; if x is a float16 CPU tensor and libtorch has no Half
// kernel for the operation, runs `run(true)` (arguments in float32) and casts
// the result back.
template <class F> auto half_cpu_fallback(const at::Tensor &x, F &&run) -> decltype(run(false)) {
    if (!(x.is_cpu() && x.scalar_type() == at::kHalf))
        return run(false);
    try {
        return run(false);
    } catch (const c10::Error &e) {
        if (std::string(e.what_without_backtrace()).find("not implemented for 'Half'") ==
            std::string::npos)
            throw;
    }
    return to_half(run(true));
}

// A 1-D [n] tensor, or NULL, checked for a layer with n channels/features.
bool is_vector_of(const ebb_tensor *t, int64_t n) {
    return !t || (t->t.dim() == 1 && t->t.size(0) == n);
}

} // namespace

extern "C" {

/* ---- host bytes into an existing tensor ---------------------------------- */

ebb_status ebb_tensor_copy_from_host(ebb_tensor *dst, const void *data, size_t nbytes) {
    static const char fn[] = "ebb_tensor_copy_from_host";
    EBB_NEED(fn, dst);
    if (!data && nbytes)
        return ebb_error_set(EBB_ERR_ARG, "%s: data is NULL", fn);
    EBB_TRY(fn, {
        at::Tensor &t = dst->t;
        size_t want = static_cast<size_t>(t.numel()) * t.element_size();
        if (want != nbytes)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: %zu bytes given, %s %s needs %zu", fn, nbytes,
                                 ebb_dtype_name(ebb::from_aten(t.scalar_type())), dims(t).c_str(),
                                 want);
        if (is_meta(t))
            return ebb_error_set(EBB_ERR_ARG, "%s: %s is a meta tensor (it has no storage)", fn,
                                 dims(t).c_str());
        if (nbytes == 0)
            return EBB_OK;
        if (t.is_cpu() && t.is_contiguous()) {
            std::memcpy(t.data_ptr(), data, nbytes);
        } else {
            // A strided or device tensor takes a copy_ from a host view. Mapped
            // files need not align elements, so misaligned bytes go through an
            // aligned host buffer first.
            at::TensorOptions host_opts = at::TensorOptions().dtype(t.scalar_type());
            at::Tensor host;
            if (reinterpret_cast<uintptr_t>(data) % t.element_size() == 0) {
                host = at::from_blob(const_cast<void *>(data), t.sizes(), host_opts);
            } else {
                host = at::empty(t.sizes(), host_opts);
                std::memcpy(host.data_ptr(), data, nbytes);
            }
            t.copy_(host);
        }
    })
    return EBB_OK;
}

/* ---- convolution and pooling --------------------------------------------- */

ebb_status ebb_tensor_conv(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                           const ebb_tensor *bias, const int64_t *stride, const int64_t *padding,
                           const int64_t *dilation, int64_t groups) {
    static const char fn[] = "ebb_tensor_conv";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, weight);
    EBB_NEED(fn, stride);
    EBB_NEED(fn, padding);
    EBB_NEED(fn, dilation);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t, &w = weight->t;
        int64_t nsp = w.dim() - 2;
        if (nsp < 1 || nsp > 3)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: weight %s must be [out, in/groups, k...] with 1 to 3 "
                                 "spatial dims",
                                 fn, dims(w).c_str());
        bool batched = xt.dim() == nsp + 2;
        if (!batched && xt.dim() != nsp + 1)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: input %s must be %lld-D [N, C, ...] or %lld-D [C, ...] for "
                                 "weight %s",
                                 fn, dims(xt).c_str(), static_cast<long long>(nsp + 2),
                                 static_cast<long long>(nsp + 1), dims(w).c_str());
        if (groups < 1)
            return ebb_error_set(EBB_ERR_ARG, "%s: groups must be >= 1, got %lld", fn,
                                 static_cast<long long>(groups));
        int64_t channels = xt.size(batched ? 1 : 0);
        if (w.size(1) * groups != channels || w.size(0) % groups != 0)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: input %s has %lld channels; weight %s with groups=%lld "
                                 "expects %lld",
                                 fn, dims(xt).c_str(), static_cast<long long>(channels),
                                 dims(w).c_str(), static_cast<long long>(groups),
                                 static_cast<long long>(w.size(1) * groups));
        if (!is_vector_of(bias, w.size(0)))
            return ebb_error_set(EBB_ERR_SHAPE, "%s: bias %s does not match weight %s", fn,
                                 dims(bias).c_str(), dims(w).c_str());
        std::vector<int64_t> out_shape(xt.sizes().begin(), xt.sizes().end());
        out_shape[batched ? 1 : 0] = w.size(0);
        for (int64_t d = 0; d < nsp; d++) {
            if (stride[d] < 1 || padding[d] < 0 || dilation[d] < 1)
                return ebb_error_set(EBB_ERR_ARG,
                                     "%s: stride %lld, padding %lld, dilation %lld (need stride "
                                     ">= 1, padding >= 0, dilation >= 1)",
                                     fn, static_cast<long long>(stride[d]),
                                     static_cast<long long>(padding[d]),
                                     static_cast<long long>(dilation[d]));
            int64_t in = xt.size(xt.dim() - nsp + d), k = w.size(2 + d);
            int64_t n = (in + 2 * padding[d] - dilation[d] * (k - 1) - 1) / stride[d] + 1;
            if (in + 2 * padding[d] < dilation[d] * (k - 1) + 1)
                n = 0;
            if (n < 1)
                return ebb_error_set(EBB_ERR_SHAPE,
                                     "%s: input %s is too small for weight %s (padding %lld, "
                                     "dilation %lld): no output positions",
                                     fn, dims(xt).c_str(), dims(w).c_str(),
                                     static_cast<long long>(padding[d]),
                                     static_cast<long long>(dilation[d]));
            out_shape[static_cast<size_t>(xt.dim() - nsp + d)] = n;
        }
        if (is_meta(xt)) {
            *out = wrap(at::empty(out_shape, xt.options()));
            return EBB_OK;
        }
        at::IntArrayRef s(stride, static_cast<size_t>(nsp)), p(padding, static_cast<size_t>(nsp)),
            dl(dilation, static_cast<size_t>(nsp));
        at::Tensor r = half_cpu_fallback(xt, [&](bool u) {
            at::Tensor xi = up(xt, u), wi = up(w, u);
            c10::optional<at::Tensor> b = up(bias, u);
            if (nsp == 1)
                return at::conv1d(xi, wi, b, s, p, dl, groups);
            if (nsp == 2)
                return at::conv2d(xi, wi, b, s, p, dl, groups);
            return at::conv3d(xi, wi, b, s, p, dl, groups);
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_pool2d(ebb_tensor **out, ebb_pool_op op, const ebb_tensor *x,
                             const int64_t kernel[2], const int64_t stride[2],
                             const int64_t padding[2], bool ceil_mode, bool count_include_pad) {
    static const char fn[] = "ebb_tensor_pool2d";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, kernel);
    if (op != EBB_POOL_MAX && op != EBB_POOL_AVG)
        return ebb_error_set(EBB_ERR_ARG, "%s: unknown pool op %d", fn, static_cast<int>(op));
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() != 3 && xt.dim() != 4)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, H, W] or [C, H, W]",
                                 fn, dims(xt).c_str());
        int64_t k[2] = {kernel[0], kernel[1]};
        int64_t s[2] = {stride ? stride[0] : k[0], stride ? stride[1] : k[1]};
        int64_t p[2] = {padding ? padding[0] : 0, padding ? padding[1] : 0};
        for (int d = 0; d < 2; d++) {
            if (k[d] < 1 || s[d] < 1 || p[d] < 0 || p[d] > k[d] / 2)
                return ebb_error_set(EBB_ERR_ARG,
                                     "%s: kernel %lld, stride %lld, padding %lld (need kernel >= "
                                     "1, stride >= 1, 0 <= padding <= kernel/2)",
                                     fn, static_cast<long long>(k[d]),
                                     static_cast<long long>(s[d]), static_cast<long long>(p[d]));
            if (xt.size(xt.dim() - 2 + d) + 2 * p[d] < k[d])
                return ebb_error_set(EBB_ERR_SHAPE,
                                     "%s: input %s is smaller than the %lldx%lld window (padding "
                                     "%lld)",
                                     fn, dims(xt).c_str(), static_cast<long long>(k[0]),
                                     static_cast<long long>(k[1]), static_cast<long long>(p[d]));
        }
        at::Tensor r = half_cpu_fallback(xt, [&](bool u) {
            at::Tensor xi = up(xt, u);
            if (op == EBB_POOL_MAX)
                return at::max_pool2d(xi, k, s, p, {1, 1}, ceil_mode);
            return at::avg_pool2d(xi, k, s, p, ceil_mode, count_include_pad);
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_adaptive_avg_pool2d(ebb_tensor **out, const ebb_tensor *x, int64_t out_h,
                                          int64_t out_w) {
    static const char fn[] = "ebb_tensor_adaptive_avg_pool2d";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() != 3 && xt.dim() != 4)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, H, W] or [C, H, W]",
                                 fn, dims(xt).c_str());
        if (out_h < 1 || out_w < 1)
            return ebb_error_set(EBB_ERR_ARG, "%s: output size %lldx%lld must be positive", fn,
                                 static_cast<long long>(out_h), static_cast<long long>(out_w));
        for (int64_t d = xt.dim() - 2; d < xt.dim(); d++)
            if (xt.size(d) < 1)
                return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s has an empty spatial dim", fn,
                                     dims(xt).c_str());
        if (is_meta(xt)) {
            std::vector<int64_t> shape(xt.sizes().begin(), xt.sizes().end());
            shape[shape.size() - 2] = out_h;
            shape[shape.size() - 1] = out_w;
            *out = wrap(at::empty(shape, xt.options()));
            return EBB_OK;
        }
        at::Tensor r = half_cpu_fallback(
            xt, [&](bool u) { return at::adaptive_avg_pool2d(up(xt, u), {out_h, out_w}); });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

/* ---- normalisation -------------------------------------------------------- */

ebb_status ebb_tensor_batch_norm(ebb_tensor **out, const ebb_tensor *x,
                                 const ebb_tensor *running_mean, const ebb_tensor *running_var,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps) {
    static const char fn[] = "ebb_tensor_batch_norm";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, running_mean);
    EBB_NEED(fn, running_var);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() < 2)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, ...]", fn,
                                 dims(xt).c_str());
        int64_t c = xt.size(1);
        const ebb_tensor *vecs[] = {running_mean, running_var, weight, bias};
        const char *names[] = {"running_mean", "running_var", "weight", "bias"};
        for (int i = 0; i < 4; i++)
            if (!is_vector_of(vecs[i], c))
                return ebb_error_set(EBB_ERR_SHAPE, "%s: %s %s does not match input %s (%lld "
                                     "channels in dim 1)",
                                     fn, names[i], dims(vecs[i]).c_str(), dims(xt).c_str(),
                                     static_cast<long long>(c));
        if (is_meta(xt)) {
            *out = wrap(at::empty(xt.sizes(), xt.options()));
            return EBB_OK;
        }
        at::Tensor r = half_cpu_fallback(xt, [&](bool u) {
            return at::batch_norm(up(xt, u), up(weight, u), up(bias, u), up(running_mean, u),
                                  up(running_var, u), /*training=*/false, /*momentum=*/0.0, eps,
                                  /*cudnn_enabled=*/true);
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_group_norm(ebb_tensor **out, const ebb_tensor *x, int64_t num_groups,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps) {
    static const char fn[] = "ebb_tensor_group_norm";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() < 2)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input %s must be [N, C, ...]", fn,
                                 dims(xt).c_str());
        int64_t c = xt.size(1);
        if (num_groups < 1 || c % num_groups != 0)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: %lld groups do not divide the %lld channels of input %s", fn,
                                 static_cast<long long>(num_groups), static_cast<long long>(c),
                                 dims(xt).c_str());
        if (!is_vector_of(weight, c) || !is_vector_of(bias, c))
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: weight %s / bias %s do not match input %s (%lld channels)",
                                 fn, dims(weight).c_str(), dims(bias).c_str(), dims(xt).c_str(),
                                 static_cast<long long>(c));
        if (is_meta(xt)) {
            *out = wrap(at::empty(xt.sizes(), xt.options()));
            return EBB_OK;
        }
        at::Tensor r = half_cpu_fallback(xt, [&](bool u) {
            return at::group_norm(up(xt, u), num_groups, up(weight, u), up(bias, u), eps);
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_rms_norm(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                               double eps) {
    static const char fn[] = "ebb_tensor_rms_norm";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &xt = x->t;
        if (xt.dim() < 1)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: input is a scalar", fn);
        int64_t d = xt.size(-1);
        if (!is_vector_of(weight, d))
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: weight %s does not match input %s (last dim %lld)", fn,
                                 dims(weight).c_str(), dims(xt).c_str(), static_cast<long long>(d));
        if (!(eps >= 0.0))
            return ebb_error_set(EBB_ERR_ARG, "%s: eps must be >= 0, got %g", fn, eps);
        if (is_meta(xt)) {
            // add_(eps) would wrap eps in a CPU tensor, real bytes in a dry
            // run; the result has the input's shape and dtype
            *out = wrap(at::empty(xt.sizes(), xt.options()));
            return EBB_OK;
        }
        // As PyTorch's rms_norm: a 16-bit input is normalised and scaled in
        // float32, and the result has the input's dtype.
        at::ScalarType st = xt.scalar_type();
        bool low = st == at::kHalf || st == at::kBFloat16;
        at::Tensor xf = low ? xt.to(at::kFloat) : xt;
        at::Tensor r = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
        if (weight)
            r = at::mul(r, weight->t);
        *out = wrap(r.scalar_type() == st ? std::move(r) : r.to(st));
    })
    return EBB_OK;
}

/* ---- embedding ------------------------------------------------------------ */

} // extern "C"

namespace {

// The first index of idx outside [0, n), read back to the host (a
// synchronisation on a GPU); false when there is none.
bool first_index_out_of_range(const at::Tensor &idx, int64_t n, int64_t *bad) {
    if (idx.numel() == 0)
        return false;
    auto mm = at::aminmax(idx);
    int64_t lo = std::get<0>(mm).item<int64_t>(), hi = std::get<1>(mm).item<int64_t>();
    *bad = lo < 0 ? lo : hi;
    return lo < 0 || hi >= n;
}

} // namespace

extern "C" {

ebb_status ebb_tensor_check_index_range(const ebb_tensor *t, int64_t n) {
    static const char fn[] = "ebb_tensor_check_index_range";
    EBB_NEED(fn, t);
    EBB_TRY(fn, {
        int64_t bad = 0;
        if (first_index_out_of_range(t->t, n, &bad))
            return ebb_error_set(EBB_ERR_ARG, "index %lld in indices %s is out of range for %lld "
                                 "embeddings",
                                 static_cast<long long>(bad), dims(t->t).c_str(),
                                 static_cast<long long>(n));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_embedding(ebb_tensor **out, const ebb_tensor *weight,
                                const ebb_tensor *indices) {
    static const char fn[] = "ebb_tensor_embedding";
    EBB_OUT(fn, out);
    EBB_NEED(fn, weight);
    EBB_NEED(fn, indices);
    EBB_TRY(fn, {
        const at::Tensor &w = weight->t, &idx = indices->t;
        if (w.dim() != 2)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: weight %s must be [num, dim]", fn,
                                 dims(w).c_str());
        if (idx.scalar_type() != at::kLong && idx.scalar_type() != at::kInt)
            return ebb_error_set(EBB_ERR_ARG, "%s: indices %s are %s; expected int64 or int32", fn,
                                 dims(idx).c_str(),
                                 ebb_dtype_name(ebb::from_aten(idx.scalar_type())));
        if (is_meta(idx) || is_meta(w)) {
            std::vector<int64_t> shape(idx.sizes().begin(), idx.sizes().end());
            shape.push_back(w.size(1));
            *out = wrap(at::empty(shape, w.options()));
            return EBB_OK;
        }
        // An out-of-range index is a device-side assert on CUDA; check first.
        // A CUDA graph cannot read the indices back: a captured plan checks
        // the inputs that reach an embedding before each replay (src/capture.c).
        bool check = true;
#ifdef EBB_WITH_CUDA
        // asked only of a CUDA tensor: asking makes a CUDA context
        check = !(idx.is_cuda() && ebb::cuda_capturing());
#endif
        int64_t bad = 0;
        if (check && first_index_out_of_range(idx, w.size(0), &bad))
            return ebb_error_set(EBB_ERR_ARG,
                                 "%s: index %lld in indices %s is out of range for %lld "
                                 "embeddings (weight %s)",
                                 fn, static_cast<long long>(bad), dims(idx).c_str(),
                                 static_cast<long long>(w.size(0)), dims(w).c_str());
        *out = wrap(at::embedding(w, idx));
    })
    return EBB_OK;
}

/* ---- attention ------------------------------------------------------------ */

int ebb_attention_fused(ebb_dtype dtype, int64_t d, int64_t dv, int64_t l, int64_t s) {
#if EBB_FLASH_ATTENTION
    bool floating = dtype == EBB_FLOAT32 || dtype == EBB_FLOAT64 || dtype == EBB_FLOAT16 ||
                    dtype == EBB_BFLOAT16;
    return floating && d == dv && l > 0 && s > 0;
#else
    (void)dtype, (void)d, (void)dv, (void)l, (void)s;
    return 0;
#endif
}

// The sizes below follow libtorch 2.x's flash-attention CPU kernels
// (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp), checked against its
// allocations on a grid of shapes, dtypes and thread counts: blocks of
// q_split query rows by kv_split key rows, one set per thread, accumulated
// in float32 for the 16-bit types.
void ebb_attention_fused_bytes_get(int64_t b, int64_t h, int64_t l, int64_t s, int64_t d,
                                   ebb_dtype dtype, int threads, ebb_attention_fused_bytes *out) {
    *out = {};
    if (!ebb_attention_fused(dtype, d, d, l, s))
        return;
    int64_t el = static_cast<int64_t>(ebb_dtype_size(dtype));
    bool reduced = dtype == EBB_FLOAT16 || dtype == EBB_BFLOAT16;
    int64_t acc = reduced ? 4 : el, nt = threads > 1 ? threads : 1;
    int64_t q_split = std::min<int64_t>(l >= 768 ? 256 : l >= 192 ? 64 : 32, l);
    int64_t kv_split = std::min<int64_t>(512, s);
    int64_t block = q_split * kv_split;
    out->lse = b * h * l * acc;
    out->forward = nt * (block + 2 * q_split + q_split * d) * acc + (reduced ? nt * block * el : 0);
    // the backward's row sums: one per chunk of the B*H (batch, head) pairs
    // a thread takes; with one thread one at a time
    int64_t pairs = b * h, chunks = 1;
    if (nt > 1 && pairs > 1) {
        int64_t per = (pairs + std::min(nt, pairs) - 1) / std::min(nt, pairs);
        chunks = (pairs + per - 1) / per;
    }
    out->backward = nt * 2 * block * acc + (reduced ? nt * 2 * block * el : 0) +
                    chunks * q_split * acc;
}


ebb_status ebb_tensor_attention(ebb_tensor **out, const ebb_tensor *q, const ebb_tensor *k,
                                const ebb_tensor *v, bool causal) {
    static const char fn[] = "ebb_tensor_attention";
    EBB_OUT(fn, out);
    EBB_NEED(fn, q);
    EBB_NEED(fn, k);
    EBB_NEED(fn, v);
    EBB_TRY(fn, {
        const at::Tensor &qt = q->t, &kt = k->t, &vt = v->t;
        if (qt.dim() < 2 || kt.dim() != qt.dim() || vt.dim() != qt.dim() ||
            kt.size(-1) != qt.size(-1) || vt.size(-2) != kt.size(-2))
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "%s: query %s, key %s and value %s do not fit [..., L, E], "
                                 "[..., S, E], [..., S, Ev]",
                                 fn, dims(qt).c_str(), dims(kt).c_str(), dims(vt).c_str());
        if (is_meta(qt)) {
            *out = wrap(at::matmul(at::matmul(qt, kt.transpose(-2, -1)), vt));
            return EBB_OK;
        }
#if EBB_FLASH_ATTENTION
        if (qt.is_cpu() && ebb::flash_takes(qt, kt, vt)) {
            // the output only: the log-sum-exp is freed here
            *out = wrap(std::get<0>(
                at::_scaled_dot_product_flash_attention_for_cpu(qt, kt, vt, 0.0, causal)));
            return EBB_OK;
        }
        if (!qt.is_cpu()) {
            *out = wrap(at::scaled_dot_product_attention(qt, kt, vt, {}, 0.0, causal));
            return EBB_OK;
        }
#endif
        at::Tensor r = half_cpu_fallback(qt, [&](bool u) {
            at::Tensor qi = up(qt, u), ki = up(kt, u), vi = up(vt, u);
            double scale = 1.0 / std::sqrt(static_cast<double>(qi.size(-1)));
            at::Tensor scores = at::matmul(qi, ki.transpose(-2, -1)).mul_(scale);
            if (causal) {
                at::Tensor above =
                    at::ones({qi.size(-2), ki.size(-2)},
                             at::TensorOptions().dtype(at::kBool).device(qi.device()))
                        .triu_(1);
                scores.masked_fill_(above, -std::numeric_limits<double>::infinity());
            }
            // drop the raw scores before the second matmul allocates
            scores = at::softmax(scores, -1);
            return at::matmul(scores, vi);
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

/* ---- recurrent cells ------------------------------------------------------ */

} // extern "C"

namespace {

// Checks x [B, I], h [B, H], w_ih [G*H, I], w_hh [G*H, H], biases [G*H].
ebb_status check_cell(const char *fn, int gates, const ebb_tensor *x, const ebb_tensor *h,
                      const ebb_tensor *c, const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                      const ebb_tensor *b_ih, const ebb_tensor *b_hh) {
    const at::Tensor &xt = x->t, &ht = h->t;
    int64_t hidden = ht.dim() == 2 ? ht.size(1) : -1;
    bool ok = xt.dim() == 2 && ht.dim() == 2 && xt.size(0) == ht.size(0) &&
              (!c || c->t.sizes().equals(ht.sizes()));
    ok = ok && w_ih->t.dim() == 2 && w_ih->t.size(0) == gates * hidden &&
         w_ih->t.size(1) == xt.size(1);
    ok = ok && w_hh->t.dim() == 2 && w_hh->t.size(0) == gates * hidden &&
         w_hh->t.size(1) == hidden;
    ok = ok && is_vector_of(b_ih, gates * hidden) && is_vector_of(b_hh, gates * hidden);
    if (ok)
        return EBB_OK;
    return ebb_error_set(EBB_ERR_SHAPE,
                         "%s: input %s and hidden state %s%s%s do not fit weight_ih %s, "
                         "weight_hh %s, bias_ih %s, bias_hh %s (expected [B, in], [B, H], "
                         "[%dH, in], [%dH, H], [%dH])",
                         fn, dims(xt).c_str(), dims(ht).c_str(), c ? ", cell state " : "",
                         c ? dims(c->t).c_str() : "", dims(w_ih).c_str(), dims(w_hh).c_str(),
                         dims(b_ih).c_str(), dims(b_hh).c_str(), gates, gates, gates);
}

} // namespace

extern "C" {

ebb_status ebb_tensor_gru_cell(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *h,
                               const ebb_tensor *w_ih, const ebb_tensor *w_hh,
                               const ebb_tensor *b_ih, const ebb_tensor *b_hh) {
    static const char fn[] = "ebb_tensor_gru_cell";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, h);
    EBB_NEED(fn, w_ih);
    EBB_NEED(fn, w_hh);
    EBB_TRY(fn, {
        if (check_cell(fn, 3, x, h, nullptr, w_ih, w_hh, b_ih, b_hh) != EBB_OK)
            return ebb_errcode();
        at::Tensor r = half_cpu_fallback(x->t, [&](bool u) {
            return at::gru_cell(up(x->t, u), up(h->t, u), up(w_ih->t, u), up(w_hh->t, u),
                                up(b_ih, u), up(b_hh, u));
        });
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_lstm_cell(ebb_tensor **h_out, ebb_tensor **c_out, const ebb_tensor *x,
                                const ebb_tensor *h, const ebb_tensor *c, const ebb_tensor *w_ih,
                                const ebb_tensor *w_hh, const ebb_tensor *b_ih,
                                const ebb_tensor *b_hh) {
    static const char fn[] = "ebb_tensor_lstm_cell";
    EBB_OUT(fn, h_out);
    EBB_OUT(fn, c_out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, h);
    EBB_NEED(fn, c);
    EBB_NEED(fn, w_ih);
    EBB_NEED(fn, w_hh);
    EBB_TRY(fn, {
        if (check_cell(fn, 4, x, h, c, w_ih, w_hh, b_ih, b_hh) != EBB_OK)
            return ebb_errcode();
        auto r = half_cpu_fallback(x->t, [&](bool u) {
            return at::lstm_cell(up(x->t, u), {up(h->t, u), up(c->t, u)}, up(w_ih->t, u),
                                 up(w_hh->t, u), up(b_ih, u), up(b_hh, u));
        });
        ebb_tensor *hn = wrap(std::move(std::get<0>(r)));
        try {
            *c_out = wrap(std::move(std::get<1>(r)));
        } catch (...) {
            ebb_tensor_free(hn);
            throw;
        }
        *h_out = hn;
    })
    return EBB_OK;
}

/* ---- rotary position embeddings, and repeated key/value heads ------------ */

} // extern "C"

namespace {

// The rotation's cos and sin tables, [T, D/2] in x's dtype and device, laid
// out to broadcast against x's halves ([T, 1, ..., 1, D/2] with the
// positions at dim `seq`). Made as Hugging Face's LlamaRotaryEmbedding makes
// them, in float32: inv_freq_j = 1 / theta^(2j / D), angle = t * inv_freq_j,
// each rounded to float32; the cos and sin of the float32 angle are then
// rounded from double. `inverse` negates sin (the rotation back). Each table
// is filled on the host as a float32 CPU tensor and, for another dtype or
// device, converted before the next is made.
std::pair<at::Tensor, at::Tensor> rotary_tables(const at::Tensor &x, int64_t seq, int64_t start,
                                                double theta, bool inverse) {
    int64_t T = x.size(seq), D = x.size(-1), h = D / 2;
    std::vector<int64_t> shape(x.dim() - seq, 1);
    shape.front() = T;
    shape.back() = h;
    auto opts = x.options();
    if (x.is_meta())
        return {at::empty(shape, opts), at::empty(shape, opts)};
    std::vector<float> inv(h);
    for (int64_t j = 0; j < h; j++)
        inv[j] = 1.0f / (float)std::pow((double)(float)theta, (double)((float)(2 * j) / (float)D));
    at::Tensor tables[2];
    for (int k = 0; k < 2; k++) {
        at::Tensor t = at::empty({T, h}, at::TensorOptions().dtype(at::kFloat));
        float *p = t.data_ptr<float>();
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = 0; j < h; j++) {
                double a = (double)((float)(start + i) * inv[j]);
                double v = k == 0 ? std::cos(a) : std::sin(a);
                p[i * h + j] = (float)(k == 1 && inverse ? -v : v);
            }
        if (opts.dtype() != at::kFloat || !x.is_cpu())
            t = t.to(opts);
        tables[k] = t.view(shape);
    }
    return {tables[0], tables[1]};
}

// x's rotated halves: [..., :h] and [..., h:], or the even and odd elements
// of the last dim (interleaved, Meta's layout).
std::pair<at::Tensor, at::Tensor> halves(const at::Tensor &t, bool interleaved) {
    int64_t h = t.size(-1) / 2;
    if (!interleaved)
        return {t.narrow(-1, 0, h), t.narrow(-1, h, h)};
    at::Tensor pairs = t.unflatten(-1, {h, 2});
    return {pairs.select(-1, 0), pairs.select(-1, 1)};
}

} // namespace

extern "C" {

ebb_status ebb_tensor_rotary(ebb_tensor **out, const ebb_tensor *x, int64_t seq_dim,
                             int64_t start, double theta, bool interleaved, bool inverse) {
    static const char fn[] = "ebb_tensor_rotary";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &t = x->t;
        int64_t nd = t.dim(), seq = seq_dim < 0 ? seq_dim + nd : seq_dim;
        if (nd < 2 || seq < 0 || seq >= nd - 1)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: the positions' dim %lld of the input %s is "
                                 "not one of its dims before the last", fn, (long long)seq_dim,
                                 dims(t).c_str());
        if (t.size(-1) % 2)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: the input %s has an odd last dim; a rotation "
                                 "turns pairs", fn, dims(t).c_str());
        if (!(theta > 0) || !std::isfinite(theta))
            return ebb_error_set(EBB_ERR_ARG, "%s: theta %g is not a positive number", fn, theta);
        if (!at::isFloatingType(t.scalar_type()))
            return ebb_error_set(EBB_ERR_ARG, "%s: the input is %s; only floating values rotate",
                                 fn, c10::toString(t.scalar_type()));
        if (start < 0)
            return ebb_error_set(EBB_ERR_ARG, "%s: positions start at %lld; give 0 or more", fn,
                                 (long long)start);
        auto tables = rotary_tables(t, seq, start, theta, inverse);
        const at::Tensor &c = tables.first, &s = tables.second;
        auto xs = halves(t, interleaved);
        if (ebb::autograd_on()) {
            // the same arithmetic, recorded for autograd (the tests' reference)
            at::Tensor r1 = xs.first * c - xs.second * s, r2 = xs.second * c + xs.first * s;
            *out = wrap(interleaved ? at::stack({r1, r2}, -1).flatten(-2) : at::cat({r1, r2}, -1));
            return EBB_OK;
        }
        at::Tensor r = at::empty_like(t, at::MemoryFormat::Contiguous);
        auto rs = halves(r, interleaved);
        if (!t.is_meta()) {
            // r1 = x1 cos - x2 sin, r2 = x2 cos + x1 sin, written into r
            at::mul_out(rs.first, xs.first, c);
            rs.first.addcmul_(xs.second, s, -1);
            at::mul_out(rs.second, xs.second, c);
            rs.second.addcmul_(xs.first, s, 1);
        }
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_repeat_interleave(ebb_tensor **out, const ebb_tensor *x, int64_t dim,
                                        int64_t repeats) {
    static const char fn[] = "ebb_tensor_repeat_interleave";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_TRY(fn, {
        const at::Tensor &t = x->t;
        if (t.dim() < 1 || dim < -t.dim() || dim >= t.dim())
            return ebb_error_set(EBB_ERR_SHAPE, "%s: dim %lld of the input %s", fn,
                                 (long long)dim, dims(t).c_str());
        if (repeats < 1)
            return ebb_error_set(EBB_ERR_ARG, "%s: repeats %lld; give 1 or more", fn,
                                 (long long)repeats);
        int64_t d = dim < 0 ? dim + t.dim() : dim;
        if (repeats == 1) {
            *out = wrap(t);
        } else {
            // [.., n, ..] -> [.., n, repeats, ..] broadcast, copied out as [.., n * repeats, ..]
            std::vector<int64_t> big(t.sizes().begin(), t.sizes().end());
            big.insert(big.begin() + d + 1, repeats);
            std::vector<int64_t> flat(t.sizes().begin(), t.sizes().end());
            flat[d] *= repeats;
            *out = wrap(t.unsqueeze(d + 1).expand(big).reshape(flat));
        }
    })
    return EBB_OK;
}

ebb_status ebb_tensor_repeat_interleave_backward(ebb_tensor **grad_x, const ebb_tensor *grad,
                                                 int64_t dim, int64_t repeats) {
    static const char fn[] = "ebb_tensor_repeat_interleave_backward";
    EBB_OUT(fn, grad_x);
    EBB_NEED(fn, grad);
    EBB_TRY(fn, {
        const at::Tensor &g = grad->t;
        int64_t d = dim < 0 ? dim + g.dim() : dim;
        if (g.dim() < 1 || d < 0 || d >= g.dim() || repeats < 1 || g.size(d) % repeats)
            return ebb_error_set(EBB_ERR_SHAPE, "%s: the gradient %s does not repeat dim %lld "
                                 "%lld times", fn, dims(g).c_str(), (long long)dim,
                                 (long long)repeats);
        if (repeats == 1) {
            *grad_x = wrap(g);
        } else {
            // each input slice's copies side by side, summed
            *grad_x = wrap(g.unflatten(d, {g.size(d) / repeats, repeats}).sum(d + 1));
        }
    })
    return EBB_OK;
}

} // extern "C"
