/* The op registry: a flat table searched by name. A few dozen entries, looked
 * up at build time only, so a linear scan is the right data structure. */
#include <string.h>

#include "ebb/op.h"

#define EBB_MAX_OPS 256

static const ebb_op *registry[EBB_MAX_OPS];
static int n_registered;

ebb_status ebb_op_register(const ebb_op *op) {
    if (!op || !op->name || !op->name[0] || !op->forward)
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: an op needs a name and a forward function");
    if (op->min_inputs < 0 || (op->max_inputs >= 0 && op->max_inputs < op->min_inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: op '%s' has input counts %d..%d",
                             op->name, op->min_inputs, op->max_inputs);
    if (op->n_attrs < 0 || op->n_attrs > EBB_MAX_ATTRS || (op->n_attrs && !op->attrs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: op '%s' has %d attributes (at most %d)",
                             op->name, op->n_attrs, EBB_MAX_ATTRS);
    if (op->grad && !op->grad->backward)
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: op '%s' has a backward rule without a "
                                          "backward function",
                             op->name);
    if (op->grad && (op->grad->n_saved < 0 || op->grad->n_saved > EBB_MAX_SAVED ||
                     (op->grad->n_saved > 0 && !op->grad->forward_train)))
        return ebb_error_set(EBB_ERR_ARG,
                             "ebb_op_register: op '%s' saves %d extras; extras (at most %d) come "
                             "from a forward_train function",
                             op->name, op->grad->n_saved, EBB_MAX_SAVED);
    if (ebb_op_find(op->name))
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: an op named '%s' is already registered",
                             op->name);
    if (n_registered == EBB_MAX_OPS)
        return ebb_error_set(EBB_ERR_ARG, "ebb_op_register: registry full (%d ops)", EBB_MAX_OPS);
    registry[n_registered++] = op;
    return EBB_OK;
}

const ebb_op *ebb_op_find(const char *name) {
    if (!name)
        return NULL;
    for (int i = 0; i < n_registered; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

int ebb_op_count(void) { return n_registered; }

const ebb_op *ebb_op_at(int i) { return i >= 0 && i < n_registered ? registry[i] : NULL; }

int ebb_op_attr_index(const ebb_op *op, const char *name) {
    if (!op || !name)
        return -1;
    for (int i = 0; i < op->n_attrs; i++)
        if (strcmp(op->attrs[i].name, name) == 0)
            return i;
    return -1;
}
