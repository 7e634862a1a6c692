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

#ifdef __cplusplus
}
#endif
#endif
