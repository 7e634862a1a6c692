/* Shared by the op files: the table each family exports to builtin.c. */
#ifndef EBB_OPS_INTERNAL_H
#define EBB_OPS_INTERNAL_H

#include "ebb/op.h"

extern const ebb_op ebb_ops_activation[];
extern const int ebb_ops_activation_count;
extern const ebb_op ebb_ops_linear[];
extern const int ebb_ops_linear_count;
extern const ebb_op ebb_ops_norm[];
extern const int ebb_ops_norm_count;
extern const ebb_op ebb_ops_combine[];
extern const int ebb_ops_combine_count;
extern const ebb_op ebb_ops_routing[];
extern const int ebb_ops_routing_count;

#define EBB_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
