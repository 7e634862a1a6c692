/* Registers every built-in op family. Called once by ebb_init(). */
#include "internal.h"
#include "ops_internal.h"

ebb_status ebb_ops_register_builtin(void) {
    const struct {
        const ebb_op *ops;
        int n;
    } families[] = {
        {ebb_ops_activation, ebb_ops_activation_count},
        {ebb_ops_pointwise, ebb_ops_pointwise_count},
        {ebb_ops_linear, ebb_ops_linear_count},
        {ebb_ops_norm, ebb_ops_norm_count},
        {ebb_ops_combine, ebb_ops_combine_count},
        {ebb_ops_routing, ebb_ops_routing_count},
        {ebb_ops_conv, ebb_ops_conv_count},
        {ebb_ops_pool, ebb_ops_pool_count},
        {ebb_ops_embedding, ebb_ops_embedding_count},
        {ebb_ops_attention, ebb_ops_attention_count},
        {ebb_ops_rotary, ebb_ops_rotary_count},
        {ebb_ops_recurrent, ebb_ops_recurrent_count},
        {ebb_ops_shape, ebb_ops_shape_count},
        {ebb_ops_math, ebb_ops_math_count},
        {ebb_ops_loss, ebb_ops_loss_count},
    };
    for (int f = 0; f < EBB_COUNT(families); f++)
        for (int i = 0; i < families[f].n; i++) {
            ebb_status st = ebb_op_register(&families[f].ops[i]);
            if (st != EBB_OK)
                return st;
        }
    return EBB_OK;
}
