/*
 * ebb.h - the umbrella header: declare a neural-network graph in C, compile
 * it to a static plan that knows the last use of every intermediate tensor,
 * and run it on libtorch so each intermediate is freed right after that use.
 *
 *   common.h  status codes, errors, ebb_init(), dtypes, devices
 *   tensor.h  the C tensor layer over libtorch
 *   memory.h  allocator-measured bytes and the live-handle count
 *   op.h      operators and the op registry
 *   graph.h   the fluent builder and immutable graphs
 *   plan.h    compiling graphs to static plans; reading plans
 *   run.h     models (parameters) and running plans
 *   optim.h   optimizers (SGD, Adam, AdamW) and their saved state
 *   train.h   training steps: forward, loss, backward and update as one plan
 *   spec.h    graphs declared in YAML
 *   safetensors.h  weights and tensors in the safetensors format
 */
#ifndef EBB_H
#define EBB_H

#include "common.h"
#include "cpu.h"
#include "data.h"
#include "dist.h"
#include "graph.h"
#include "memory.h"
#include "op.h"
#include "optim.h"
#include "schedule.h"
#include "plan.h"
#include "run.h"
#include "safetensors.h"
#include "spec.h"
#include "tensor.h"
#include "train.h"
#include "trainer.h"

#endif
