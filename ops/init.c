/* ebb_init(): the process-wide setup, once, above both layers: the tensor
 * layer's (the allocator, the threads), then the built-in operators
 * registered. */
#include <pthread.h>
#include <stdio.h>

#include "internal.h"
#include "ops_internal.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static ebb_status init_status = EBB_OK;
static char init_errmsg[512];

static void init_process(void) {
    init_status = ebb_tensor_process_init();
    if (init_status == EBB_OK)
        init_status = ebb_ops_register_builtin();
    if (init_status != EBB_OK)
        snprintf(init_errmsg, sizeof init_errmsg, "%s", ebb_errmsg());
}

ebb_status ebb_init(void) {
    pthread_once(&init_once, init_process);
    if (init_status != EBB_OK)
        return ebb_error_set(init_status, "%s", init_errmsg);
    return EBB_OK;
}
