/* Declarations shared inside the library, not part of the public API. */
#ifndef EBB_INTERNAL_H
#define EBB_INTERNAL_H

#include "ebb/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the accounting CPU allocator (ops/tensor/memory.cpp). */
ebb_status ebb_tensor_layer_init(void);
/* Registers the built-in operators (ops/). */
ebb_status ebb_ops_register_builtin(void);

/* A CUDA graph (ops/tensor/cuda_graph.cpp). ebb_cuda_graph_capture() calls
 * body(ctx, 0) twice on a side stream to warm up, then records body(ctx, 1);
 * replay relaunches what was recorded. Without CUDA, capture fails with
 * EBB_ERR_UNSUPPORTED. */
typedef struct ebb_cuda_graph ebb_cuda_graph;
typedef ebb_status (*ebb_cuda_graph_body)(void *ctx, int capturing);
ebb_status ebb_cuda_graph_capture(ebb_cuda_graph **out, int device, ebb_cuda_graph_body body,
                                  void *ctx);
ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g);
void ebb_cuda_graph_free(ebb_cuda_graph *g);

#ifdef __cplusplus
}
#endif
#endif
