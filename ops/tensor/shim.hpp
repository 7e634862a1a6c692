// Internal to the tensor layer: the one place C++ meets ebb's C API.
//
// EBB_TRY wraps a body that may throw. Every C++ exception stops here and
// becomes an ebb_status plus a message, so no exception crosses into C.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include "ebb/common.h"
#include "ebb/tensor.h"

struct ebb_tensor {
    at::Tensor t;
};

namespace ebb {

// Wraps a tensor in a new handle and counts it live.
ebb_tensor *wrap(at::Tensor t);
void count_handle(int delta);

at::ScalarType to_aten(ebb_dtype dtype);
ebb_dtype from_aten(at::ScalarType st);
at::Device to_aten(ebb_device device);
ebb_device from_aten(const at::Device &device);
at::IntArrayRef dims_of(const ebb_shape *shape);
ebb_shape shape_of(const at::Tensor &t);
// "float32 [4, 16] on cpu": a tensor as messages name it.
std::string describe(const at::Tensor &t);

// "[2, 3, 4]": a tensor's dimensions, for messages.
std::string dims(const at::Tensor &t);

// Sets every given out-pointer to NULL.
void clear(std::initializer_list<ebb_tensor **> outs);

// Hands several results out at once: every out slot given gets its tensor
// (NULL for an undefined one), or none does (handles already made are freed
// when wrapping one fails).
void hand_out(std::initializer_list<std::pair<ebb_tensor **, at::Tensor>> results);

// libtorch 2.x has fused flash-attention kernels for the CPU; 1.13 has not.
// With them, attention's forward and backward take the shapes flash_takes()
// accepts ([B, H, L, D] operands of one dtype and width, unit stride along D)
// through them, and their scratch is ebb_attention_fused_bytes_get()'s.
#if TORCH_VERSION_MAJOR >= 2
#define EBB_FLASH_ATTENTION 1
#else
#define EBB_FLASH_ATTENTION 0
#endif
bool flash_takes(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v);

// Turns the exception in flight into a status and message prefixed by `fn`.
ebb_status fail_from_exception(const char *fn);

// True between ebb_tensor_autograd_begin() and _end() on this thread (grad.cpp):
// EBB_TRY then records autograd history instead of entering inference mode, so
// tests can differentiate the very ATen calls an op makes.
bool autograd_on();

#ifdef EBB_WITH_CUDA
// A CUDA generator seeded with `seed` for one draw (cuda_graph.cpp): a new
// one, except while a CUDA graph is captured, where the graph owns it.
at::Generator seeded_cuda_generator(int device, uint64_t seed);
// True while the current CUDA stream is being captured into a graph.
bool cuda_capturing();
#endif

// clip_grad_norm_'s parts (optim.cpp), which the ranks' version in
// dist.cpp shares: the checks, the norm of the gradients together, and the
// factor from the norm.
ebb_status clip_grad_norm_check(const char *fn, ebb_tensor *const *grads, int n, double max_norm,
                                const at::Tensor **first);
at::Tensor grad_norm(ebb_tensor *const *grads, int n);
bool repeated_grad(ebb_tensor *const *grads, int i);
double clip_factor(double total, at::ScalarType dtype, double max_norm);

} // namespace ebb

// Checks the out-pointer and clears it, so a failed call leaves *out NULL.
#define EBB_OUT(fn, out)                                                                           \
    do {                                                                                           \
        if (!(out))                                                                                \
            return ebb_error_set(EBB_ERR_ARG, "%s: out is NULL", fn);                              \
        *(out) = nullptr;                                                                          \
    } while (0)

// A required argument.
#define EBB_NEED(fn, t)                                                                            \
    do {                                                                                           \
        if (!(t))                                                                                  \
            return ebb_error_set(EBB_ERR_ARG, "%s: " #t " is NULL", fn);                           \
    } while (0)

#define EBB_TRY(fn, ...)                                                                           \
    try {                                                                                          \
        c10::InferenceMode ebb_inference_guard_(!ebb::autograd_on());                              \
        __VA_ARGS__                                                                                \
    } catch (...) {                                                                                \
        return ebb::fail_from_exception(fn);                                                       \
    }
