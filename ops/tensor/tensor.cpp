// The tensor layer: ebb's C API over ATen. Each function converts its
// arguments, calls ATen inside EBB_TRY (inference mode, exceptions caught) and
// wraps the result in a new handle.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ScalarOps.h>
#include <ATen/Parallel.h>
#include <ATen/native/TypeProperties.h>

#include "shim.hpp"

namespace ebb {

ebb_tensor *wrap(at::Tensor t) {
    ebb_tensor *h = new ebb_tensor{std::move(t)};
    count_handle(+1);
    return h;
}

at::ScalarType to_aten(ebb_dtype dtype) {
    switch (dtype) {
    case EBB_FLOAT32: return at::kFloat;
    case EBB_FLOAT16: return at::kHalf;
    case EBB_BFLOAT16: return at::kBFloat16;
    case EBB_FLOAT64: return at::kDouble;
    case EBB_INT64: return at::kLong;
    case EBB_INT32: return at::kInt;
    case EBB_UINT8: return at::kByte;
    case EBB_BOOL: return at::kBool;
    }
    throw std::invalid_argument("unknown ebb_dtype " + std::to_string(static_cast<int>(dtype)));
}

ebb_dtype from_aten(at::ScalarType st) {
    switch (st) {
    case at::kFloat: return EBB_FLOAT32;
    case at::kHalf: return EBB_FLOAT16;
    case at::kBFloat16: return EBB_BFLOAT16;
    case at::kDouble: return EBB_FLOAT64;
    case at::kLong: return EBB_INT64;
    case at::kInt: return EBB_INT32;
    case at::kByte: return EBB_UINT8;
    case at::kBool: return EBB_BOOL;
    default: return EBB_FLOAT32;
    }
}

at::Device to_aten(ebb_device device) {
    switch (device.type) {
    case EBB_DEVICE_CPU: return at::Device(at::kCPU);
    case EBB_DEVICE_META: return at::Device(at::kMeta);
    case EBB_DEVICE_CUDA: return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
    }
    throw std::invalid_argument("unknown ebb_device type");
}

ebb_device from_aten(const at::Device &device) {
    ebb_device d{EBB_DEVICE_CPU, 0};
    if (device.is_cuda()) {
        d.type = EBB_DEVICE_CUDA;
        d.index = device.has_index() ? device.index() : 0;
    } else if (device.type() == at::kMeta) {
        d.type = EBB_DEVICE_META;
    }
    return d;
}

at::IntArrayRef dims_of(const ebb_shape *shape) {
    if (!shape || shape->ndim < 0 || shape->ndim > EBB_MAX_DIMS)
        throw std::invalid_argument("invalid shape");
    return at::IntArrayRef(shape->dim, static_cast<size_t>(shape->ndim));
}

ebb_shape shape_of(const at::Tensor &t) {
    ebb_shape s{};
    if (t.dim() > EBB_MAX_DIMS)
        throw std::invalid_argument("tensor has " + std::to_string(t.dim()) +
                                    " dims; ebb supports up to " + std::to_string(EBB_MAX_DIMS));
    s.ndim = static_cast<int>(t.dim());
    for (int i = 0; i < s.ndim; i++)
        s.dim[i] = t.size(i);
    return s;
}

std::string describe(const at::Tensor &t) {
    char buf[160];
    ebb_shape s = shape_of(t);
    return std::string(ebb_dtype_name(from_aten(t.scalar_type()))) + " " +
           ebb_shape_str(&s, buf, sizeof buf) + " on " + t.device().str();
}

ebb_status fail_from_exception(const char *fn) {
    try {
        throw;
    } catch (const c10::OutOfMemoryError &e) {
        return ebb_error_set(EBB_ERR_NOMEM, "%s: %s", fn, e.what_without_backtrace());
    } catch (const c10::NotImplementedError &e) {
        return ebb_error_set(EBB_ERR_UNSUPPORTED, "%s: %s", fn, e.what_without_backtrace());
    } catch (const c10::Error &e) {
        // ATen reports shape mismatches as plain c10::Error; its message names
        // both shapes, which is what a caller needs.
        std::string msg = e.what_without_backtrace();
        bool shape = msg.find("shape") != std::string::npos ||
                     msg.find("size") != std::string::npos ||
                     msg.find("dimension") != std::string::npos;
        return ebb_error_set(shape ? EBB_ERR_SHAPE : EBB_ERR_TORCH, "%s: %s", fn, msg.c_str());
    } catch (const std::bad_alloc &) {
        return ebb_error_set(EBB_ERR_NOMEM, "%s: out of memory", fn);
    } catch (const std::invalid_argument &e) {
        return ebb_error_set(EBB_ERR_ARG, "%s: %s", fn, e.what());
    } catch (const std::exception &e) {
        return ebb_error_set(EBB_ERR_TORCH, "%s: %s", fn, e.what());
    } catch (...) {
        return ebb_error_set(EBB_ERR_TORCH, "%s: unknown C++ exception", fn);
    }
}

std::string dims(const at::Tensor &t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); i++)
        s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
}

void clear(std::initializer_list<ebb_tensor **> outs) {
    for (ebb_tensor **o : outs)
        if (o)
            *o = nullptr;
}

void hand_out(std::initializer_list<std::pair<ebb_tensor **, at::Tensor>> results) {
    std::vector<ebb_tensor *> made;
    try {
        for (auto &r : results)
            made.push_back(r.first && r.second.defined() ? wrap(r.second) : nullptr);
    } catch (...) {
        for (ebb_tensor *h : made)
            ebb_tensor_free(h);
        throw;
    }
    size_t i = 0;
    for (auto &r : results) {
        if (r.first)
            *r.first = made[i];
        i++;
    }
}

} // namespace ebb

using ebb::wrap;

namespace {


at::TensorOptions opts(ebb_dtype dtype, ebb_device device) {
    return at::TensorOptions().dtype(ebb::to_aten(dtype)).device(ebb::to_aten(device));
}

// Random values come from a CPU generator so a seed means the same numbers on
// every device.
at::Tensor on_device(at::Tensor cpu_values, ebb_dtype dtype, ebb_device device) {
    return cpu_values.to(ebb::to_aten(device), ebb::to_aten(dtype));
}

std::vector<at::Tensor> tensors_of(ebb_tensor *const *xs, int n) {
    std::vector<at::Tensor> v;
    v.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) {
        if (!xs[i])
            throw std::invalid_argument("input " + std::to_string(i) + " is NULL");
        v.push_back(xs[i]->t);
    }
    return v;
}

} // namespace

extern "C" {

/* ---- shapes ------------------------------------------------------------ */

int64_t ebb_shape_numel(const ebb_shape *shape) {
    if (!shape || shape->ndim < 0 || shape->ndim > EBB_MAX_DIMS)
        return -1;
    int64_t n = 1;
    for (int i = 0; i < shape->ndim; i++) {
        int64_t d = shape->dim[i];
        if (d < 0 || (d > 0 && n > INT64_MAX / d))
            return -1;
        n *= d;
    }
    return n;
}

int ebb_shape_equal(const ebb_shape *a, const ebb_shape *b) {
    if (!a || !b || a->ndim != b->ndim || a->ndim < 0 || a->ndim > EBB_MAX_DIMS)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i])
            return 0;
    return 1;
}

const char *ebb_shape_str(const ebb_shape *shape, char *buf, size_t size) {
    size_t at = 0;
    if (size == 0)
        return buf;
    if (!shape || shape->ndim < 0 || shape->ndim > EBB_MAX_DIMS) {
        snprintf(buf, size, "[invalid shape]");
        return buf;
    }
    at += static_cast<size_t>(snprintf(buf, size, "["));
    for (int i = 0; i < shape->ndim && at < size; i++)
        at += static_cast<size_t>(snprintf(buf + at, size - at, i ? ", %lld" : "%lld",
                                           static_cast<long long>(shape->dim[i])));
    if (at < size)
        snprintf(buf + at, size - at, "]");
    return buf;
}

/* ---- lifetime ---------------------------------------------------------- */

void ebb_tensor_free(ebb_tensor *t) {
    if (!t)
        return;
    ebb::count_handle(-1);
    delete t;
}

ebb_status ebb_tensor_ref(ebb_tensor **out, const ebb_tensor *t) {
    EBB_OUT("ebb_tensor_ref", out);
    EBB_NEED("ebb_tensor_ref", t);
    EBB_TRY("ebb_tensor_ref", *out = wrap(t->t);)
    return EBB_OK;
}

ebb_status ebb_tensor_clone(ebb_tensor **out, const ebb_tensor *t) {
    EBB_OUT("ebb_tensor_clone", out);
    EBB_NEED("ebb_tensor_clone", t);
    EBB_TRY("ebb_tensor_clone", *out = wrap(t->t.clone(at::MemoryFormat::Contiguous));)
    return EBB_OK;
}

/* ---- creation ---------------------------------------------------------- */

ebb_status ebb_tensor_zeros(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device) {
    EBB_OUT("ebb_tensor_zeros", out);
    EBB_TRY("ebb_tensor_zeros", *out = wrap(at::zeros(ebb::dims_of(shape), opts(dtype, device)));)
    return EBB_OK;
}

ebb_status ebb_tensor_zeros_laid_out(ebb_tensor **out, const ebb_tensor *like,
                                     ebb_device device) {
    EBB_OUT("ebb_tensor_zeros_laid_out", out);
    EBB_NEED("ebb_tensor_zeros_laid_out", like);
    EBB_TRY("ebb_tensor_zeros_laid_out", {
        const at::Tensor &l = like->t;
        *out = wrap(at::empty_strided(l.sizes(), l.strides(),
                                      opts(ebb::from_aten(l.scalar_type()), device))
                        .zero_());
    })
    return EBB_OK;
}

int ebb_tensor_strides(const ebb_tensor *t, int64_t *out, int max) {
    if (!t || t->t.dim() > max)
        return -1;
    for (int64_t d = 0; d < t->t.dim(); d++)
        out[d] = t->t.stride(d);
    return (int)t->t.dim();
}

ebb_status ebb_tensor_arange(ebb_tensor **out, int64_t start, int64_t end, ebb_dtype dtype,
                             ebb_device device) {
    EBB_OUT("ebb_tensor_arange", out);
    if (end < start)
        return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_arange: end %lld is below start %lld",
                             (long long)end, (long long)start);
    EBB_TRY("ebb_tensor_arange", *out = wrap(at::arange(start, end, opts(dtype, device)));)
    return EBB_OK;
}

ebb_status ebb_tensor_ones(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                           ebb_device device) {
    EBB_OUT("ebb_tensor_ones", out);
    EBB_TRY("ebb_tensor_ones", *out = wrap(at::ones(ebb::dims_of(shape), opts(dtype, device)));)
    return EBB_OK;
}

ebb_status ebb_tensor_full(ebb_tensor **out, const ebb_shape *shape, double value,
                           ebb_dtype dtype, ebb_device device) {
    EBB_OUT("ebb_tensor_full", out);
    EBB_TRY("ebb_tensor_full",
            *out = wrap(at::full(ebb::dims_of(shape), value, opts(dtype, device)));)
    return EBB_OK;
}

ebb_status ebb_tensor_empty(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device) {
    EBB_OUT("ebb_tensor_empty", out);
    EBB_TRY("ebb_tensor_empty", *out = wrap(at::empty(ebb::dims_of(shape), opts(dtype, device)));)
    return EBB_OK;
}

ebb_status ebb_tensor_randn(ebb_tensor **out, const ebb_shape *shape, ebb_dtype dtype,
                            ebb_device device, uint64_t seed) {
    EBB_OUT("ebb_tensor_randn", out);
    EBB_TRY("ebb_tensor_randn", {
        at::Generator gen = at::detail::createCPUGenerator(seed);
        at::Tensor cpu = at::randn(ebb::dims_of(shape), gen, at::TensorOptions().dtype(at::kFloat));
        *out = wrap(on_device(cpu, dtype, device));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_uniform(ebb_tensor **out, const ebb_shape *shape, double lo, double hi,
                              ebb_dtype dtype, ebb_device device, uint64_t seed) {
    EBB_OUT("ebb_tensor_uniform", out);
    EBB_TRY("ebb_tensor_uniform", {
        at::Generator gen = at::detail::createCPUGenerator(seed);
        at::Tensor cpu = at::empty(ebb::dims_of(shape), at::TensorOptions().dtype(at::kFloat));
        cpu.uniform_(lo, hi, gen);
        *out = wrap(on_device(cpu, dtype, device));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_from_host(ebb_tensor **out, const void *data, size_t nbytes,
                                const ebb_shape *shape, ebb_dtype dtype, ebb_device device) {
    EBB_OUT("ebb_tensor_from_host", out);
    EBB_NEED("ebb_tensor_from_host", data);
    EBB_NEED("ebb_tensor_from_host", shape);
    int64_t numel = ebb_shape_numel(shape);
    if (numel < 0 || (numel > 0 && static_cast<uint64_t>(numel) >
                                       SIZE_MAX / (ebb_dtype_size(dtype) ? ebb_dtype_size(dtype) : 1)))
        return ebb_error_set(EBB_ERR_SHAPE, "ebb_tensor_from_host: invalid shape (ndim %d)",
                             shape->ndim);
    size_t want = static_cast<size_t>(numel) * ebb_dtype_size(dtype);
    if (want != nbytes) {
        char buf[128];
        return ebb_error_set(EBB_ERR_SHAPE,
                             "ebb_tensor_from_host: %zu bytes given, %s %s needs %zu", nbytes,
                             ebb_dtype_name(dtype), ebb_shape_str(shape, buf, sizeof buf), want);
    }
    EBB_TRY("ebb_tensor_from_host", {
        at::Tensor t = at::empty(ebb::dims_of(shape), opts(dtype, device));
        if (device.type == EBB_DEVICE_CPU) {
            if (nbytes)
                std::memcpy(t.data_ptr(), data, nbytes);
        } else {
            // from_blob views the caller's memory; copy_ moves it to the device.
            at::Tensor host = at::from_blob(const_cast<void *>(data), ebb::dims_of(shape),
                                            at::TensorOptions().dtype(ebb::to_aten(dtype)));
            t.copy_(host);
        }
        *out = wrap(std::move(t));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_to_host(const ebb_tensor *t, void *data, size_t nbytes) {
    EBB_NEED("ebb_tensor_to_host", t);
    EBB_NEED("ebb_tensor_to_host", data);
    size_t have = ebb_tensor_nbytes(t);
    if (have != nbytes)
        return ebb_error_set(EBB_ERR_SHAPE, "ebb_tensor_to_host: buffer is %zu bytes, tensor is %zu",
                             nbytes, have);
    EBB_TRY("ebb_tensor_to_host", {
        at::Tensor host = t->t.to(at::kCPU).contiguous();
        if (nbytes)
            std::memcpy(data, host.data_ptr(), nbytes);
    })
    return EBB_OK;
}

ebb_status ebb_tensor_to(ebb_tensor **out, const ebb_tensor *t, ebb_device device,
                         ebb_dtype dtype) {
    EBB_OUT("ebb_tensor_to", out);
    EBB_NEED("ebb_tensor_to", t);
    EBB_TRY("ebb_tensor_to",
            *out = wrap(t->t.to(ebb::to_aten(device), ebb::to_aten(dtype)));)
    return EBB_OK;
}

/* ---- queries ----------------------------------------------------------- */

ebb_shape ebb_tensor_shape(const ebb_tensor *t) {
    ebb_shape s{};
    if (t && t->t.dim() <= EBB_MAX_DIMS)
        s = ebb::shape_of(t->t);
    return s;
}

int ebb_tensor_ndim(const ebb_tensor *t) { return t ? static_cast<int>(t->t.dim()) : 0; }

ebb_dtype ebb_tensor_dtype(const ebb_tensor *t) {
    return t ? ebb::from_aten(t->t.scalar_type()) : EBB_FLOAT32;
}

ebb_device ebb_tensor_device(const ebb_tensor *t) {
    return t ? ebb::from_aten(t->t.device()) : ebb_device_cpu();
}

int64_t ebb_tensor_numel(const ebb_tensor *t) { return t ? t->t.numel() : 0; }

size_t ebb_tensor_nbytes(const ebb_tensor *t) {
    if (!t)
        return 0;
    return static_cast<size_t>(t->t.numel()) * t->t.element_size();
}

size_t ebb_tensor_storage_nbytes(const ebb_tensor *t) {
    return t && t->t.has_storage() ? t->t.storage().nbytes() : 0;
}

int ebb_tensor_same_storage(const ebb_tensor *a, const ebb_tensor *b) {
    return a && b && a->t.has_storage() && b->t.has_storage() && a->t.storage().is_alias_of(b->t.storage());
}

int ebb_tensor_is_exclusive(const ebb_tensor *t) {
    return t && t->t.defined() && t->t.use_count() == 1 && t->t.has_storage() &&
           t->t.storage().use_count() == 1;
}

ebb_status ebb_tensor_item(const ebb_tensor *t, double *out) {
    EBB_NEED("ebb_tensor_item", t);
    EBB_NEED("ebb_tensor_item", out);
    EBB_TRY("ebb_tensor_item", *out = t->t.item().toDouble();)
    return EBB_OK;
}

ebb_status ebb_tensor_mean_value(const ebb_tensor *t, double *out) {
    EBB_NEED("ebb_tensor_mean_value", t);
    EBB_NEED("ebb_tensor_mean_value", out);
    EBB_TRY("ebb_tensor_mean_value", {
        const at::Tensor &x = t->t;
        if (x.device().is_cpu() && x.is_contiguous() &&
            (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble)) {
            // summed on the host: a loop test allocates nothing
            double sum = 0.0;
            int64_t n = x.numel();
            if (x.scalar_type() == at::kFloat)
                for (const float *v = x.data_ptr<float>(), *e = v + n; v < e; v++)
                    sum += *v;
            else
                for (const double *v = x.data_ptr<double>(), *e = v + n; v < e; v++)
                    sum += *v;
            *out = n ? sum / static_cast<double>(n) : std::nan("");
        } else {
            *out = x.to(at::kDouble).mean().item().toDouble();
        }
    })
    return EBB_OK;
}

ebb_status ebb_tensor_max_abs_diff(const ebb_tensor *a, const ebb_tensor *b, double *out) {
    EBB_NEED("ebb_tensor_max_abs_diff", a);
    EBB_NEED("ebb_tensor_max_abs_diff", b);
    EBB_NEED("ebb_tensor_max_abs_diff", out);
    EBB_TRY("ebb_tensor_max_abs_diff", {
        if (!a->t.sizes().equals(b->t.sizes())) {
            char sa[128], sb[128];
            ebb_shape xa = ebb::shape_of(a->t), xb = ebb::shape_of(b->t);
            return ebb_error_set(EBB_ERR_SHAPE, "ebb_tensor_max_abs_diff: shapes %s and %s differ",
                                 ebb_shape_str(&xa, sa, sizeof sa), ebb_shape_str(&xb, sb, sizeof sb));
        }
        at::Tensor d = (a->t.to(at::kDouble) - b->t.to(at::kDouble).to(a->t.device())).abs();
        *out = d.numel() ? d.max().item().toDouble() : 0.0;
    })
    return EBB_OK;
}

ebb_status ebb_tensor_allclose(const ebb_tensor *a, const ebb_tensor *b, double rtol, double atol,
                               int *out) {
    EBB_NEED("ebb_tensor_allclose", a);
    EBB_NEED("ebb_tensor_allclose", b);
    EBB_NEED("ebb_tensor_allclose", out);
    *out = 0;
    EBB_TRY("ebb_tensor_allclose", {
        if (!a->t.sizes().equals(b->t.sizes()))
            return EBB_OK;
        at::Tensor x = a->t.to(at::kCPU, at::kDouble), y = b->t.to(at::kCPU, at::kDouble);
        *out = at::allclose(x, y, rtol, atol) ? 1 : 0;
    })
    return EBB_OK;
}

/* ---- arithmetic -------------------------------------------------------- */

ebb_status ebb_tensor_unary(ebb_tensor **out, ebb_unary_op op, const ebb_tensor *x) {
    EBB_OUT("ebb_tensor_unary", out);
    EBB_NEED("ebb_tensor_unary", x);
    EBB_TRY("ebb_tensor_unary", {
        const at::Tensor &t = x->t;
        at::Tensor r;
        switch (op) {
        case EBB_RELU:
            // aten::relu has no meta kernel in 1.13; on the CPU it is
            // clamp_min(x, 0) after refusing bool, which the dry run mirrors
            if (t.is_meta()) {
                TORCH_CHECK(t.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
                r = at::clamp_min(t, 0);
            } else {
                r = at::relu(t);
            }
            break;
        case EBB_GELU: r = at::gelu(t); break;
        case EBB_GELU_TANH: r = at::gelu(t, "tanh"); break;
        case EBB_TANH: r = at::tanh(t); break;
        case EBB_SIGMOID: r = at::sigmoid(t); break;
        case EBB_SILU: r = at::silu(t); break;
        case EBB_NEG: r = at::neg(t); break;
        case EBB_EXP: r = at::exp(t); break;
        case EBB_LOG: r = at::log(t); break;
        case EBB_SQRT: r = at::sqrt(t); break;
        // aten::abs has no meta kernel in 1.13: the dry run needs the shape only
        case EBB_ABS: r = t.is_meta() ? at::empty_like(t) : at::abs(t); break;
        case EBB_RSQRT: r = at::rsqrt(t); break;
        case EBB_SIN: r = at::sin(t); break;
        case EBB_COS: r = at::cos(t); break;
        default: return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_unary: unknown op %d", (int)op);
        }
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_unary_(ebb_tensor *x, ebb_unary_op op) {
    EBB_NEED("ebb_tensor_unary_", x);
    EBB_TRY("ebb_tensor_unary_", {
        at::Tensor &t = x->t;
        switch (op) {
        case EBB_RELU:
            if (t.is_meta()) {
                TORCH_CHECK(t.scalar_type() != at::kBool, "Boolean inputs not supported for relu");
                at::clamp_min_(t, 0);
            } else {
                at::relu_(t);
            }
            break;
        case EBB_GELU: at::gelu_out(t, t); break;
        case EBB_GELU_TANH: at::gelu_out(t, t, "tanh"); break;
        case EBB_TANH: t.tanh_(); break;
        case EBB_SIGMOID: t.sigmoid_(); break;
        case EBB_SILU: at::silu_(t); break;
        case EBB_NEG: t.neg_(); break;
        case EBB_EXP: t.exp_(); break;
        case EBB_LOG: t.log_(); break;
        case EBB_SQRT: t.sqrt_(); break;
        case EBB_ABS:
            if (!t.is_meta()) t.abs_();
            break;
        case EBB_RSQRT: t.rsqrt_(); break;
        case EBB_SIN: t.sin_(); break;
        case EBB_COS: t.cos_(); break;
        default: return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_unary_: unknown op %d", (int)op);
        }
    })
    return EBB_OK;
}

ebb_status ebb_tensor_pow(ebb_tensor **out, const ebb_tensor *x, double exponent) {
    EBB_OUT("ebb_tensor_pow", out);
    EBB_NEED("ebb_tensor_pow", x);
    EBB_TRY("ebb_tensor_pow", *out = wrap(at::pow(x->t, exponent));)
    return EBB_OK;
}

ebb_status ebb_tensor_pow_(ebb_tensor *x, double exponent) {
    EBB_NEED("ebb_tensor_pow_", x);
    EBB_TRY("ebb_tensor_pow_", x->t.pow_(exponent);)
    return EBB_OK;
}

namespace {
// A clamp bound: none for an infinite one (clamping to it changes nothing).
c10::optional<at::Scalar> bound(double v) {
    return std::isinf(v) ? c10::optional<at::Scalar>() : c10::optional<at::Scalar>(v);
}
} // namespace

ebb_status ebb_tensor_clamp(ebb_tensor **out, const ebb_tensor *x, double lo, double hi) {
    EBB_OUT("ebb_tensor_clamp", out);
    EBB_NEED("ebb_tensor_clamp", x);
    EBB_TRY("ebb_tensor_clamp", {
        c10::optional<at::Scalar> l = bound(lo), h = bound(hi);
        *out = wrap(l || h ? at::clamp(x->t, l, h) : x->t.clone());
    })
    return EBB_OK;
}

ebb_status ebb_tensor_clamp_(ebb_tensor *x, double lo, double hi) {
    EBB_NEED("ebb_tensor_clamp_", x);
    EBB_TRY("ebb_tensor_clamp_", {
        c10::optional<at::Scalar> l = bound(lo), h = bound(hi);
        if (l || h) x->t.clamp_(l, h);
    })
    return EBB_OK;
}

ebb_status ebb_tensor_binary(ebb_tensor **out, ebb_binary_op op, const ebb_tensor *a,
                             const ebb_tensor *b) {
    EBB_OUT("ebb_tensor_binary", out);
    EBB_NEED("ebb_tensor_binary", a);
    EBB_NEED("ebb_tensor_binary", b);
    EBB_TRY("ebb_tensor_binary", {
        at::Tensor r;
        switch (op) {
        case EBB_ADD: r = at::add(a->t, b->t); break;
        case EBB_SUB: r = at::sub(a->t, b->t); break;
        case EBB_MUL: r = at::mul(a->t, b->t); break;
        case EBB_DIV: r = at::div(a->t, b->t); break;
        case EBB_MAXIMUM: r = at::maximum(a->t, b->t); break;
        case EBB_MINIMUM: r = at::minimum(a->t, b->t); break;
        default: return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_binary: unknown op %d", (int)op);
        }
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_add_(ebb_tensor *a, const ebb_tensor *b) {
    EBB_NEED("ebb_tensor_add_", a);
    EBB_NEED("ebb_tensor_add_", b);
    EBB_TRY("ebb_tensor_add_", a->t.add_(b->t);)
    return EBB_OK;
}

ebb_status ebb_tensor_lerp_(ebb_tensor *a, const ebb_tensor *b, double weight) {
    EBB_NEED("ebb_tensor_lerp_", a);
    EBB_NEED("ebb_tensor_lerp_", b);
    EBB_TRY("ebb_tensor_lerp_", a->t.lerp_(b->t, weight);)
    return EBB_OK;
}

ebb_status ebb_tensor_addcmul(ebb_tensor **out, const ebb_tensor *acc, const ebb_tensor *a,
                              const ebb_tensor *b) {
    EBB_OUT("ebb_tensor_addcmul", out);
    EBB_NEED("ebb_tensor_addcmul", acc);
    EBB_NEED("ebb_tensor_addcmul", a);
    EBB_NEED("ebb_tensor_addcmul", b);
    EBB_TRY("ebb_tensor_addcmul", *out = wrap(at::addcmul(acc->t, a->t, b->t));)
    return EBB_OK;
}

ebb_status ebb_tensor_affine(ebb_tensor **out, const ebb_tensor *x, double scale, double shift) {
    EBB_OUT("ebb_tensor_affine", out);
    EBB_NEED("ebb_tensor_affine", x);
    EBB_TRY("ebb_tensor_affine", {
        if (x->t.is_meta()) {
            // The Scalar overloads wrap the number in a CPU tensor: real
            // bytes in a dry run. Wrapped on the meta device, it promotes
            // dtypes the same way.
            at::Device dev = x->t.device();
            at::Tensor r = scale == 1.0 ? x->t.clone()
                                        : at::mul(x->t, at::native::wrapped_scalar_tensor(scale, dev));
            if (shift != 0.0)
                r.add_(at::native::wrapped_scalar_tensor(shift, dev));
            *out = wrap(std::move(r));
            return EBB_OK;
        }
        at::Tensor r = scale == 1.0 ? x->t.clone() : at::mul(x->t, scale);
        if (shift != 0.0)
            r.add_(shift);
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

} // extern "C"

namespace {

// t *= v and t += v in place. The Scalar overloads wrap v in a CPU tensor,
// real bytes in a dry run, so on meta tensors v is wrapped there instead
// (promoting dtypes the same way).
void mul_scalar_(at::Tensor &t, double v) {
    if (t.is_meta())
        t.mul_(at::native::wrapped_scalar_tensor(v, t.device()));
    else if (!at::isFloatingType(t.scalar_type()) && v == static_cast<double>(static_cast<int64_t>(v)))
        t.mul_(static_cast<int64_t>(v));
    else
        t.mul_(v);
}

void add_scalar_(at::Tensor &t, double v) {
    if (t.is_meta())
        t.add_(at::native::wrapped_scalar_tensor(v, t.device()));
    else if (!at::isFloatingType(t.scalar_type()) && v == static_cast<double>(static_cast<int64_t>(v)))
        t.add_(static_cast<int64_t>(v)); // a count: a double would not cast back to int64
    else
        t.add_(v);
}

} // namespace

extern "C" {

ebb_status ebb_tensor_affine_(ebb_tensor *x, double scale, double shift) {
    EBB_NEED("ebb_tensor_affine_", x);
    EBB_TRY("ebb_tensor_affine_", {
        if (ebb::autograd_on() && x->t.requires_grad()) {
            // autograd may need the old values (max's backward does): the
            // reference rebinds the handle to a new tensor instead
            x->t = x->t * scale + shift;
            return EBB_OK;
        }
        if (scale != 1.0)
            mul_scalar_(x->t, scale);
        if (shift != 0.0)
            add_scalar_(x->t, shift);
    })
    return EBB_OK;
}

} // extern "C"

namespace {

// dst := a OP b, written into dst (which may be a or b itself).
void binary_into(at::Tensor &dst, ebb_binary_op op, const at::Tensor &a, const at::Tensor &b) {
    switch (op) {
    case EBB_ADD: at::add_out(dst, a, b); return;
    case EBB_SUB: at::sub_out(dst, a, b); return;
    case EBB_MUL: at::mul_out(dst, a, b); return;
    case EBB_DIV: at::div_out(dst, a, b); return;
    case EBB_MAXIMUM: at::maximum_out(dst, a, b); return;
    case EBB_MINIMUM: at::minimum_out(dst, a, b); return;
    }
    throw std::invalid_argument("unknown op " + std::to_string(static_cast<int>(op)));
}

at::Tensor binary_of(ebb_binary_op op, const at::Tensor &a, const at::Tensor &b) {
    switch (op) {
    case EBB_ADD: return at::add(a, b);
    case EBB_SUB: return at::sub(a, b);
    case EBB_MUL: return at::mul(a, b);
    case EBB_DIV: return at::div(a, b);
    case EBB_MAXIMUM: return at::maximum(a, b);
    case EBB_MINIMUM: return at::minimum(a, b);
    }
    throw std::invalid_argument("unknown op " + std::to_string(static_cast<int>(op)));
}

// The fold of xs into one new tensor of their broadcast shape and promoted
// dtype (`floating`: at least the default float type), the only allocation.
at::Tensor fold_into_new(ebb_binary_op op, ebb_tensor *const *xs, int n, bool floating) {
    std::vector<at::Tensor> ts = tensors_of(xs, n);
    if (n < 2)
        throw std::invalid_argument("needs at least 2 tensors, got " + std::to_string(n));
    at::DimVector shape(ts[0].sizes().begin(), ts[0].sizes().end());
    for (int i = 1; i < n; i++)
        shape = at::infer_size_dimvector(shape, ts[static_cast<size_t>(i)].sizes());
    at::ScalarType dt = at::native::result_type(ts);
    if (floating && !at::isFloatingType(dt) && !at::isComplexType(dt))
        dt = at::typeMetaToScalarType(at::get_default_dtype());
    if (ebb::autograd_on()) {
        // out= kernels refuse autograd; the reference differentiates the
        // same left-to-right chain, one functional op at a time
        at::Tensor r = binary_of(op, ts[0], ts[1]);
        for (size_t i = 2; i < ts.size(); i++)
            r = binary_of(op, r, ts[i]);
        return r.to(dt);
    }
    at::Tensor r = at::empty(shape, ts[0].options().dtype(dt));
    // an out= op does not broadcast its inputs to the output's shape: the
    // first input, expanded (a view), makes the first two fill all of r
    binary_into(r, op, ts[0].expand(shape), ts[1]);
    for (size_t i = 2; i < ts.size(); i++)
        binary_into(r, op, r, ts[i]);
    return r;
}

} // namespace

extern "C" {

ebb_status ebb_tensor_fold(ebb_tensor **out, ebb_binary_op op, ebb_tensor *const *xs, int n) {
    EBB_OUT("ebb_tensor_fold", out);
    EBB_NEED("ebb_tensor_fold", xs);
    EBB_TRY("ebb_tensor_fold", *out = wrap(fold_into_new(op, xs, n, false));)
    return EBB_OK;
}

ebb_status ebb_tensor_average(ebb_tensor **out, ebb_tensor *const *xs, int n) {
    EBB_OUT("ebb_tensor_average", out);
    EBB_NEED("ebb_tensor_average", xs);
    EBB_TRY("ebb_tensor_average", {
        at::Tensor r = fold_into_new(EBB_ADD, xs, n, true);
        mul_scalar_(r, 1.0 / n);
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

int ebb_tensor_num_threads(void) {
    try {
        return at::get_num_threads();
    } catch (...) {
        return 1;
    }
}

ebb_status ebb_tensor_compare(ebb_tensor **out, ebb_compare_op op, const ebb_tensor *x,
                              double value) {
    EBB_OUT("ebb_tensor_compare", out);
    EBB_NEED("ebb_tensor_compare", x);
    EBB_TRY("ebb_tensor_compare", {
        at::Tensor r;
        switch (op) {
        case EBB_EQ: r = at::eq(x->t, value); break;
        case EBB_NE: r = at::ne(x->t, value); break;
        case EBB_LT: r = at::lt(x->t, value); break;
        case EBB_LE: r = at::le(x->t, value); break;
        case EBB_GT: r = at::gt(x->t, value); break;
        case EBB_GE: r = at::ge(x->t, value); break;
        default: return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_compare: unknown op %d", (int)op);
        }
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_matmul(ebb_tensor **out, const ebb_tensor *a, const ebb_tensor *b) {
    EBB_OUT("ebb_tensor_matmul", out);
    EBB_NEED("ebb_tensor_matmul", a);
    EBB_NEED("ebb_tensor_matmul", b);
    EBB_TRY("ebb_tensor_matmul", *out = wrap(at::matmul(a->t, b->t));)
    return EBB_OK;
}

ebb_status ebb_tensor_masked_fill(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *mask,
                                  double value) {
    static const char fn[] = "ebb_tensor_masked_fill";
    EBB_OUT(fn, out);
    EBB_NEED(fn, x);
    EBB_NEED(fn, mask);
    EBB_TRY(fn, {
        if (mask->t.scalar_type() != at::kBool)
            return ebb_error_set(EBB_ERR_ARG, "%s: the mask %s is %s, not bool", fn,
                                 ebb::dims(mask->t).c_str(), c10::toString(mask->t.scalar_type()));
        *out = wrap(at::masked_fill(x->t, mask->t, value));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_where(ebb_tensor **out, const ebb_tensor *cond, const ebb_tensor *a,
                            const ebb_tensor *b) {
    static const char fn[] = "ebb_tensor_where";
    EBB_OUT(fn, out);
    EBB_NEED(fn, cond);
    EBB_NEED(fn, a);
    EBB_NEED(fn, b);
    EBB_TRY(fn, {
        if (cond->t.scalar_type() != at::kBool)
            return ebb_error_set(EBB_ERR_ARG, "%s: the condition %s is %s, not bool", fn,
                                 ebb::dims(cond->t).c_str(),
                                 c10::toString(cond->t.scalar_type()));
        if (a->t.is_meta()) { // 1.13 has no meta where: the broadcast shape and dtype
            auto size = at::infer_size(at::infer_size(cond->t.sizes(), a->t.sizes()), b->t.sizes());
            *out = wrap(at::empty(size, a->t.options().dtype(at::result_type(a->t, b->t))));
        } else {
            *out = wrap(at::where(cond->t, a->t, b->t));
        }
    })
    return EBB_OK;
}

ebb_status ebb_tensor_causal_mask(ebb_tensor **out, int64_t rows, int64_t cols,
                                  ebb_device device) {
    static const char fn[] = "ebb_tensor_causal_mask";
    EBB_OUT(fn, out);
    if (rows < 0 || cols < 0)
        return ebb_error_set(EBB_ERR_ARG, "%s: %lld x %lld", fn, (long long)rows, (long long)cols);
    EBB_TRY(fn, *out = wrap(at::ones({rows, cols}, opts(EBB_BOOL, device)).triu_(1));)
    return EBB_OK;
}

ebb_status ebb_tensor_linear(ebb_tensor **out, const ebb_tensor *x, const ebb_tensor *weight,
                             const ebb_tensor *bias) {
    EBB_OUT("ebb_tensor_linear", out);
    EBB_NEED("ebb_tensor_linear", x);
    EBB_NEED("ebb_tensor_linear", weight);
    EBB_TRY("ebb_tensor_linear", {
        const at::Tensor &xt = x->t, &w = weight->t;
        // One row (a generated token's step) on the CPU: a matrix-vector
        // product reads the weight once, where a matrix product with one row
        // first packs all of it (a third of the time, at 256 x 688), and
        // makes the same single output.
        if (xt.is_cpu() && !xt.is_meta() && !ebb::autograd_on() && xt.dim() >= 1 &&
            xt.numel() == xt.size(-1) && w.dim() == 2 && w.size(1) == xt.size(-1) &&
            w.scalar_type() == xt.scalar_type() &&
            (xt.scalar_type() == at::kFloat || xt.scalar_type() == at::kDouble) &&
            (!bias || bias->t.scalar_type() == xt.scalar_type())) {
            std::vector<int64_t> shape(xt.sizes().begin(), xt.sizes().end());
            shape.back() = w.size(0);
            at::Tensor y = bias ? at::addmv(bias->t, w, xt.reshape({xt.size(-1)}))
                                : at::mv(w, xt.reshape({xt.size(-1)}));
            *out = wrap(y.view(shape));
            return EBB_OK;
        }
        c10::optional<at::Tensor> b;
        if (bias)
            b = bias->t;
        *out = wrap(at::linear(xt, w, b));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_softmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim) {
    EBB_OUT("ebb_tensor_softmax", out);
    EBB_NEED("ebb_tensor_softmax", x);
    EBB_TRY("ebb_tensor_softmax", *out = wrap(at::softmax(x->t, dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_log_softmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim) {
    EBB_OUT("ebb_tensor_log_softmax", out);
    EBB_NEED("ebb_tensor_log_softmax", x);
    EBB_TRY("ebb_tensor_log_softmax", *out = wrap(at::log_softmax(x->t, dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_layer_norm(ebb_tensor **out, const ebb_tensor *x, int normalized_ndim,
                                 const ebb_tensor *weight, const ebb_tensor *bias, double eps) {
    EBB_OUT("ebb_tensor_layer_norm", out);
    EBB_NEED("ebb_tensor_layer_norm", x);
    EBB_TRY("ebb_tensor_layer_norm", {
        int64_t nd = x->t.dim();
        if (normalized_ndim < 1 || normalized_ndim > nd)
            return ebb_error_set(EBB_ERR_SHAPE,
                                 "ebb_tensor_layer_norm: cannot normalise %d dims of a %lld-D input",
                                 normalized_ndim, static_cast<long long>(nd));
        at::IntArrayRef norm = x->t.sizes().slice(static_cast<size_t>(nd - normalized_ndim));
        c10::optional<at::Tensor> w, b;
        if (weight)
            w = weight->t;
        if (bias)
            b = bias->t;
        if (x->t.is_meta()) {
            // at::layer_norm reaches aten::native_batch_norm on meta tensors,
            // which has no meta kernel in 1.13. The CPU kernel checks these
            // shapes and returns a contiguous tensor of the input's shape.
            TORCH_CHECK(!w || w->sizes().equals(norm),
                        "Expected weight to be of same shape as normalized_shape, but got weight "
                        "of shape ", w->sizes(), " and normalized_shape = ", norm);
            TORCH_CHECK(!b || b->sizes().equals(norm),
                        "Expected bias to be of same shape as normalized_shape, but got bias of "
                        "shape ", b->sizes(), " and normalized_shape = ", norm);
            *out = wrap(at::empty(x->t.sizes(), x->t.options()));
            return EBB_OK;
        }
        *out = wrap(at::layer_norm(x->t, norm, w, b, eps));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_reduce(ebb_tensor **out, ebb_reduce_op op, const ebb_tensor *x,
                             const int64_t *dims, int ndims, bool keepdim) {
    EBB_OUT("ebb_tensor_reduce", out);
    EBB_NEED("ebb_tensor_reduce", x);
    EBB_TRY("ebb_tensor_reduce", {
        at::Tensor r;
        at::IntArrayRef d(dims, static_cast<size_t>(ndims > 0 ? ndims : 0));
        switch (op) {
        case EBB_REDUCE_SUM: r = ndims ? at::sum(x->t, d, keepdim) : at::sum(x->t); break;
        case EBB_REDUCE_MEAN: r = ndims ? at::mean(x->t, d, keepdim) : at::mean(x->t); break;
        case EBB_REDUCE_MAX:
        case EBB_REDUCE_MIN:
            if (ndims > 1)
                return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_reduce: max/min take one dim, got %d",
                                     ndims);
            if (!ndims && x->t.is_meta()) {
                // the full max and min have no meta kernels in 1.13; amax and
                // amin give the same 0-dim result
                TORCH_CHECK(x->t.numel() > 0, op == EBB_REDUCE_MAX ? "max" : "min",
                            "(): Expected reduction dim to be specified for input.numel() == 0. "
                            "Specify the reduction dim with the 'dim' argument.");
                r = op == EBB_REDUCE_MAX ? at::amax(x->t) : at::amin(x->t);
            } else if (op == EBB_REDUCE_MAX)
                r = ndims ? std::get<0>(at::max(x->t, dims[0], keepdim)) : at::max(x->t);
            else
                r = ndims ? std::get<0>(at::min(x->t, dims[0], keepdim)) : at::min(x->t);
            break;
        default: return ebb_error_set(EBB_ERR_ARG, "ebb_tensor_reduce: unknown op %d", (int)op);
        }
        *out = wrap(std::move(r));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_argmax(ebb_tensor **out, const ebb_tensor *x, int64_t dim) {
    EBB_OUT("ebb_tensor_argmax", out);
    EBB_NEED("ebb_tensor_argmax", x);
    EBB_TRY("ebb_tensor_argmax", *out = wrap(at::argmax(x->t, dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_topk(ebb_tensor **values, ebb_tensor **indices, const ebb_tensor *x,
                           int64_t k, int64_t dim) {
    EBB_OUT("ebb_tensor_topk", values);
    EBB_OUT("ebb_tensor_topk", indices);
    EBB_NEED("ebb_tensor_topk", x);
    EBB_TRY("ebb_tensor_topk", {
        auto r = at::topk(x->t, k, dim);
        ebb_tensor *v = wrap(std::get<0>(r));
        try {
            *indices = wrap(std::get<1>(r));
        } catch (...) {
            ebb_tensor_free(v);
            throw;
        }
        *values = v;
    })
    return EBB_OK;
}

ebb_status ebb_tensor_scatter(ebb_tensor **out, const ebb_tensor *x, int64_t dim,
                              const ebb_tensor *index, const ebb_tensor *src) {
    EBB_OUT("ebb_tensor_scatter", out);
    EBB_NEED("ebb_tensor_scatter", x);
    EBB_NEED("ebb_tensor_scatter", index);
    EBB_NEED("ebb_tensor_scatter", src);
    EBB_TRY("ebb_tensor_scatter", *out = wrap(at::zeros_like(x->t).scatter_(dim, index->t, src->t));)
    return EBB_OK;
}

/* ---- joining and indexing ---------------------------------------------- */

ebb_status ebb_tensor_cat(ebb_tensor **out, ebb_tensor *const *xs, int n, int64_t dim) {
    EBB_OUT("ebb_tensor_cat", out);
    EBB_NEED("ebb_tensor_cat", xs);
    EBB_TRY("ebb_tensor_cat", *out = wrap(at::cat(tensors_of(xs, n), dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_stack(ebb_tensor **out, ebb_tensor *const *xs, int n, int64_t dim) {
    EBB_OUT("ebb_tensor_stack", out);
    EBB_NEED("ebb_tensor_stack", xs);
    EBB_TRY("ebb_tensor_stack", *out = wrap(at::stack(tensors_of(xs, n), dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_index_select(ebb_tensor **out, const ebb_tensor *x, int64_t dim,
                                   const ebb_tensor *index) {
    EBB_OUT("ebb_tensor_index_select", out);
    EBB_NEED("ebb_tensor_index_select", x);
    EBB_NEED("ebb_tensor_index_select", index);
    EBB_TRY("ebb_tensor_index_select", *out = wrap(at::index_select(x->t, dim, index->t));)
    return EBB_OK;
}

ebb_status ebb_tensor_index_copy_(ebb_tensor *x, int64_t dim, const ebb_tensor *index,
                                  const ebb_tensor *src) {
    EBB_NEED("ebb_tensor_index_copy_", x);
    EBB_NEED("ebb_tensor_index_copy_", index);
    EBB_NEED("ebb_tensor_index_copy_", src);
    EBB_TRY("ebb_tensor_index_copy_", x->t.index_copy_(dim, index->t, src->t);)
    return EBB_OK;
}

ebb_status ebb_tensor_copy_(ebb_tensor *dst, const ebb_tensor *src) {
    EBB_NEED("ebb_tensor_copy_", dst);
    EBB_NEED("ebb_tensor_copy_", src);
    EBB_TRY("ebb_tensor_copy_", dst->t.copy_(src->t, /*non_blocking=*/true);)
    return EBB_OK;
}

ebb_status ebb_tensor_index_add_(ebb_tensor *x, int64_t dim, const ebb_tensor *index,
                                 const ebb_tensor *src) {
    EBB_NEED("ebb_tensor_index_add_", x);
    EBB_NEED("ebb_tensor_index_add_", index);
    EBB_NEED("ebb_tensor_index_add_", src);
    EBB_TRY("ebb_tensor_index_add_", x->t.index_add_(dim, index->t, src->t);)
    return EBB_OK;
}

ebb_status ebb_tensor_nonzero_1d(ebb_tensor **out, const ebb_tensor *x) {
    EBB_OUT("ebb_tensor_nonzero_1d", out);
    EBB_NEED("ebb_tensor_nonzero_1d", x);
    EBB_TRY("ebb_tensor_nonzero_1d", {
        if (x->t.dim() != 1)
            return ebb_error_set(EBB_ERR_SHAPE, "ebb_tensor_nonzero_1d: expected a 1-D tensor, got %lld-D",
                                 static_cast<long long>(x->t.dim()));
        *out = wrap(at::nonzero(x->t).view({-1}));
    })
    return EBB_OK;
}

ebb_status ebb_tensor_cast(ebb_tensor **out, const ebb_tensor *x, ebb_dtype dtype) {
    EBB_OUT("ebb_tensor_cast", out);
    EBB_NEED("ebb_tensor_cast", x);
    EBB_TRY("ebb_tensor_cast", *out = wrap(x->t.to(ebb::to_aten(dtype)));)
    return EBB_OK;
}

/* ---- views ------------------------------------------------------------- */

ebb_status ebb_tensor_reshape(ebb_tensor **out, const ebb_tensor *x, const ebb_shape *shape) {
    EBB_OUT("ebb_tensor_reshape", out);
    EBB_NEED("ebb_tensor_reshape", x);
    EBB_TRY("ebb_tensor_reshape", *out = wrap(x->t.reshape(ebb::dims_of(shape)));)
    return EBB_OK;
}

ebb_status ebb_tensor_flatten(ebb_tensor **out, const ebb_tensor *x, int64_t start_dim,
                              int64_t end_dim) {
    EBB_OUT("ebb_tensor_flatten", out);
    EBB_NEED("ebb_tensor_flatten", x);
    EBB_TRY("ebb_tensor_flatten", *out = wrap(x->t.flatten(start_dim, end_dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_permute(ebb_tensor **out, const ebb_tensor *x, const int64_t *dims,
                              int ndims) {
    EBB_OUT("ebb_tensor_permute", out);
    EBB_NEED("ebb_tensor_permute", x);
    EBB_TRY("ebb_tensor_permute",
            *out = wrap(x->t.permute(at::IntArrayRef(dims, static_cast<size_t>(ndims))));)
    return EBB_OK;
}

ebb_status ebb_tensor_transpose(ebb_tensor **out, const ebb_tensor *x, int64_t dim0,
                                int64_t dim1) {
    EBB_OUT("ebb_tensor_transpose", out);
    EBB_NEED("ebb_tensor_transpose", x);
    EBB_TRY("ebb_tensor_transpose", *out = wrap(x->t.transpose(dim0, dim1));)
    return EBB_OK;
}

ebb_status ebb_tensor_unsqueeze(ebb_tensor **out, const ebb_tensor *x, int64_t dim) {
    EBB_OUT("ebb_tensor_unsqueeze", out);
    EBB_NEED("ebb_tensor_unsqueeze", x);
    EBB_TRY("ebb_tensor_unsqueeze", *out = wrap(x->t.unsqueeze(dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_squeeze(ebb_tensor **out, const ebb_tensor *x, int64_t dim) {
    EBB_OUT("ebb_tensor_squeeze", out);
    EBB_NEED("ebb_tensor_squeeze", x);
    EBB_TRY("ebb_tensor_squeeze", *out = wrap(x->t.squeeze(dim));)
    return EBB_OK;
}

ebb_status ebb_tensor_narrow(ebb_tensor **out, const ebb_tensor *x, int64_t dim, int64_t start,
                             int64_t length) {
    EBB_OUT("ebb_tensor_narrow", out);
    EBB_NEED("ebb_tensor_narrow", x);
    EBB_TRY("ebb_tensor_narrow", *out = wrap(x->t.narrow(dim, start, length));)
    return EBB_OK;
}

ebb_status ebb_tensor_select(ebb_tensor **out, const ebb_tensor *x, int64_t dim, int64_t index) {
    EBB_OUT("ebb_tensor_select", out);
    EBB_NEED("ebb_tensor_select", x);
    EBB_TRY("ebb_tensor_select", *out = wrap(x->t.select(dim, index));)
    return EBB_OK;
}

ebb_status ebb_tensor_contiguous(ebb_tensor **out, const ebb_tensor *x) {
    EBB_OUT("ebb_tensor_contiguous", out);
    EBB_NEED("ebb_tensor_contiguous", x);
    EBB_TRY("ebb_tensor_contiguous", *out = wrap(x->t.contiguous());)
    return EBB_OK;
}

} // extern "C"
