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

extern const ebb_op ebb_ops_conv[];
extern const int ebb_ops_conv_count;
extern const ebb_op ebb_ops_pool[];
extern const int ebb_ops_pool_count;
extern const ebb_op ebb_ops_embedding[];
extern const int ebb_ops_embedding_count;
extern const ebb_op ebb_ops_attention[];
extern const int ebb_ops_attention_count;
extern const ebb_op ebb_ops_recurrent[];
extern const int ebb_ops_recurrent_count;
extern const ebb_op ebb_ops_shape[];
extern const int ebb_ops_shape_count;
extern const ebb_op ebb_ops_math[];
extern const int ebb_ops_math_count;

/* Parses a STRING attribute holding a list of integers ("-1,64", "0 2 1",
 * "[1, 2]") into out[max]; *n gets the count. Errors name the op and the
 * attribute (ops/shape.c). */
ebb_status ebb_ops_parse_ints(const char *op, const char *attr, const char *text, int64_t *out,
                              int max, int *n);
/* Checks that dim lies in [-ndim, ndim) and returns it made non-negative in
 * *out; the error names the op and the input shape (ops/shape.c). */
ebb_status ebb_ops_check_dim(const char *op, int64_t dim, const ebb_shape *x, int64_t *out);

#define EBB_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
