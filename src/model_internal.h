/* The model's layout, shared with the executor. */
#ifndef EBB_MODEL_INTERNAL_H
#define EBB_MODEL_INTERNAL_H

#include <stdatomic.h>

#include "ebb/run.h"

struct ebb_model {
    ebb_device device;
    ebb_dtype dtype;
    int n_params;
    ebb_tensor **params; /* in the plan's parameter order */
    char **names;
    /* the other names tied nodes give parameters (ebb_node_share): alias k
     * is aliases[k], a name of parameter alias_of[k] */
    char **aliases;
    int *alias_of;
    int n_aliases;
    unsigned char *buffer; /* 1: a buffer or counter (batch_norm's running statistics):
                              no gradient, and no optimizer state */
    unsigned char *frozen; /* 1: a parameter the training plan the model was made from
                              does not update (frozen, no gradient reaches it, or ZeRO-1
                              gives it to another rank): no optimizer state is made for it
                              up front */
    /* The id of the last plan the parameters were checked against: runs of
     * the same plan skip the check (parameters cannot change shape). Ids are
     * unique per process, unlike addresses of freed plans. */
    atomic_uint_fast64_t checked_plan;
};

int ebb_model_param_index(const ebb_model *m, const char *name);

#endif
