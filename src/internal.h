/* Declarations shared inside the library, not part of the public API. */
#ifndef EBB_INTERNAL_H
#define EBB_INTERNAL_H

#include "ebb/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs the accounting CPU allocator (src/memory.cpp). */
ebb_status ebb_tensor_layer_init(void);
/* Registers the built-in operators (ops/). */
ebb_status ebb_ops_register_builtin(void);

struct ebb_capture;
struct ebb_plan;
struct ebb_model;
struct ebb_tensor;
/* The CUDA half of ebb_plan_capture (src/cuda_graph.cpp), called once the
 * plan is known to be capturable and the model is on a CUDA device. */
ebb_status ebb_cuda_graph_capture(struct ebb_capture **out, const struct ebb_plan *plan,
                                  const struct ebb_model *model, struct ebb_tensor *const *inputs);

#ifdef __cplusplus
}
#endif
#endif
