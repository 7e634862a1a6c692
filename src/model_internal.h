/* The model's layout, shared with the executor. */
#ifndef EBB_MODEL_INTERNAL_H
#define EBB_MODEL_INTERNAL_H

#include "ebb/run.h"

struct ebb_model {
    ebb_device device;
    ebb_dtype dtype;
    int n_params;
    ebb_tensor **params; /* in the plan's parameter order */
    char **names;
};

int ebb_model_param_index(const ebb_model *m, const char *name);

#endif
