/* Declarations shared inside the library, not part of the public API. */
#ifndef EBB_INTERNAL_H
#define EBB_INTERNAL_H

#include "ebb/common.h"
#include "ebb/optim.h"
#include "ebb/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the accounting CPU allocator (ops/tensor/memory.cpp). */
ebb_status ebb_tensor_layer_init(void);
/* Sets the intra-op threads from EBB_NUM_THREADS or ebb_default_num_threads()
 * (ops/tensor/cpu.cpp). */
ebb_status ebb_tensor_threads_init(void);
/* The tensor layer's setup, once per process (ebb_init): freed memory kept
 * in the process, the accounting allocator, the threads. */
ebb_status ebb_tensor_process_init(void);

/* A CUDA graph (ops/tensor/cuda_graph.cpp). ebb_cuda_graph_capture() calls
 * body(ctx, 0) twice on a side stream to warm up, then records body(ctx, 1);
 * replay relaunches what was recorded. Without CUDA, capture fails with
 * EBB_ERR_UNSUPPORTED. */
typedef struct ebb_cuda_graph ebb_cuda_graph;
typedef ebb_status (*ebb_cuda_graph_body)(void *ctx, int capturing);
ebb_status ebb_cuda_graph_capture(ebb_cuda_graph **out, int device, ebb_cuda_graph_body body,
                                  void *ctx);
/* The seeded random draws (dropout's masks) the graph replays, in order:
 * their count, and in *seeds the seed each had at capture. */
int ebb_cuda_graph_draws(const ebb_cuda_graph *g, const uint64_t **seeds);
/* Replays the graph; seeds: one per draw (ebb_cuda_graph_draws), or NULL
 * for the capture's own. */
ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g, const uint64_t *seeds);
void ebb_cuda_graph_free(ebb_cuda_graph *g);

/* ebb_tensor_sgd_update_ and ebb_tensor_adam_update_ with their changing
 * hyperparameters read from `hyper` on the device (ops/tensor/optim.cpp,
 * src/optim.c), or as numbers when it is NULL. */
ebb_status ebb_tensor_sgd_update_hyper_(ebb_tensor *param, const ebb_tensor *grad,
                                        ebb_tensor **momentum_buffer,
                                        const ebb_optimizer_options *opts,
                                        const ebb_tensor *hyper);
ebb_status ebb_tensor_adam_update_hyper_(ebb_tensor *param, const ebb_tensor *grad,
                                         ebb_tensor *exp_avg, ebb_tensor *exp_avg_sq,
                                         ebb_tensor *max_exp_avg_sq, int64_t step,
                                         const ebb_optimizer_options *opts,
                                         const ebb_tensor *hyper);

/* torch.optim's RMSprop, Adagrad and Adadelta updates of one parameter
 * (ops/tensor/optim.cpp), in the manner of ebb_tensor_adam_update_: every
 * tensor allocated before the first write; `hyper` as for the _hyper_
 * kernels above (its first element the negated step size). grad_avg is
 * RMSprop's with `centered`, momentum_buffer its with momentum (else NULL);
 * Adagrad's `step` counts this update. */
ebb_status ebb_tensor_rmsprop_update_(ebb_tensor *param, const ebb_tensor *grad,
                                      ebb_tensor *square_avg, ebb_tensor *grad_avg,
                                      ebb_tensor *momentum_buffer,
                                      const ebb_optimizer_options *opts,
                                      const ebb_tensor *hyper);
ebb_status ebb_tensor_adagrad_update_(ebb_tensor *param, const ebb_tensor *grad, ebb_tensor *sum,
                                      int64_t step, const ebb_optimizer_options *opts,
                                      const ebb_tensor *hyper);
ebb_status ebb_tensor_adadelta_update_(ebb_tensor *param, const ebb_tensor *grad,
                                       ebb_tensor *square_avg, ebb_tensor *acc_delta,
                                       const ebb_optimizer_options *opts,
                                       const ebb_tensor *hyper);

/* Checks integer class indices: each in [0, classes) or ignore_index
 * (EBB_ERR_ARG naming the first that is not). Reads the tensor back. */
ebb_status ebb_tensor_check_class_range(const ebb_tensor *t, int64_t classes,
                                        int64_t ignore_index);

/* Zeros on `device` with the sizes and strides of `like` (a meta tensor
 * from the compiler's dry run, say): a view's layout, for a kernel whose
 * copies depend on it. */
ebb_status ebb_tensor_zeros_laid_out(ebb_tensor **out, const ebb_tensor *like,
                                     ebb_device device);

/* Writes t's strides (elements) into out[max]; returns its dims, or -1 for
 * NULL t or more than max dims. */
int ebb_tensor_strides(const ebb_tensor *t, int64_t *out, int max);

/* Checks integer indices: each in [0, n) (EBB_ERR_ARG naming the first
 * that is not). Reads the tensor back. */
ebb_status ebb_tensor_check_index_range(const ebb_tensor *t, int64_t n);

/* What ebb_tensor_batch_norm_train allocates beyond its three results for
 * input x (ops/tensor/grad.cpp): the CPU kernel's per-channel temporaries
 * while it updates the running statistics, whose count depends on the
 * libtorch version and on whether x has one value per channel and sample. */
int64_t ebb_batch_norm_train_scratch(const ebb_shape *x, ebb_dtype dtype);

/* Fused attention on the CPU (ops/tensor/tensor_nn.cpp), for the scratch
 * formulas of the ops that call it. Whether ebb_tensor_attention and the
 * multi-head attention backward run libtorch's flash-attention CPU kernels
 * for this dtype, query/key width d, value width dv and lengths l (query)
 * and s (key): libtorch 2.x has them; with 1.13, or for shapes they do not
 * take, the calls fall back to matmul and softmax. */
int ebb_attention_fused(ebb_dtype dtype, int64_t d, int64_t dv, int64_t l, int64_t s);

/* What those kernels allocate for B batches of H heads, beyond their inputs
 * and results, at `threads` intra-op threads. */
typedef struct ebb_attention_fused_bytes {
    int64_t lse;      /* the forward's log-sum-exp [B, H, L], a second result
                         (freed at once by ebb_tensor_attention) */
    int64_t forward;  /* the forward's per-thread blocks, freed before it returns */
    int64_t backward; /* the backward's per-thread blocks (with more than one
                         thread, every chunk's row sums at once: a bound) */
} ebb_attention_fused_bytes;
void ebb_attention_fused_bytes_get(int64_t b, int64_t h, int64_t l, int64_t s, int64_t d,
                                   ebb_dtype dtype, int threads, ebb_attention_fused_bytes *out);

#ifdef __cplusplus
}
#endif
#endif
