/* The executor's entry for every kind of plan (src/exec.c), shared with
 * the training calls (src/train.c). */
#ifndef EBB_RUN_INTERNAL_H
#define EBB_RUN_INTERNAL_H

#include "ebb/optim.h"
#include "ebb/run.h"

/* Runs any plan, training plans included: `inputs` holds the graph's inputs
 * followed by a training plan's targets; `opt` runs the update steps (NULL
 * for plans without any). Checks the model and the inputs as ebb_run() does. */
ebb_status ebb_run_plan(const ebb_plan *plan, const ebb_model *model, ebb_tensor *const *inputs,
                        ebb_tensor **outputs, const ebb_run_options *opts, ebb_run_stats *stats,
                        ebb_optimizer *opt);

#endif
