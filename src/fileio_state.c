/* The writer's process-wide state (src/fileio.h): the temporary files of
 * the writes in flight, for ebb_file_remove_temporaries(), and the fault
 * injector of the tests. fileio.c is compiled into libebb and into the ebb
 * command; this file is in the library alone, and exported, so that both
 * copies of the writer share one registry and one injector. */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "fileio.h"

/* More writes in flight at once than any caller makes; one past it is
 * written as well, but ebb_file_remove_temporaries() cannot see it. */
#define MAX_IN_FLIGHT 64

static _Atomic(char *) in_flight[MAX_IN_FLIGHT];
/* Calls of ebb_file_remove_temporaries() under way: a writer whose path one
 * of them took waits for it before freeing the path. */
static atomic_int removing;

int ebb_file_track(char *tmp) {
    for (int i = 0; i < MAX_IN_FLIGHT; i++) {
        char *none = NULL;
        if (atomic_compare_exchange_strong(&in_flight[i], &none, tmp))
            return i;
    }
    return -1;
}

void ebb_file_untrack(int slot) {
    if (slot < 0 || slot >= MAX_IN_FLIGHT)
        return;
    if (atomic_exchange(&in_flight[slot], NULL) != NULL)
        return;
    /* a remover took it and may still be reading it (a signal handler on
     * another thread): only then is there anything to wait for */
    while (atomic_load(&removing) > 0)
        ;
}

/* Async-signal-safe: lock-free atomics and unlink(2) only. */
void ebb_file_remove_temporaries(void) {
    atomic_fetch_add(&removing, 1);
    for (int i = 0; i < MAX_IN_FLIGHT; i++) {
        char *p = atomic_exchange(&in_flight[i], NULL);
        if (p)
            unlink(p);
    }
    atomic_fetch_sub(&removing, 1);
}

/* ---- fault injection ---------------------------------------------------------- */

static atomic_llong fail_left, ops;
static atomic_int fail_err, fail_fired;

void ebb_file_fail_nth(int64_t n, int err) {
    atomic_store(&fail_fired, 0);
    atomic_store(&ops, 0);
    atomic_store(&fail_err, err);
    atomic_store(&fail_left, n > 0 ? (long long)n : 0);
}

int ebb_file_fail_fired(void) { return atomic_load(&fail_fired); }

int64_t ebb_file_op_count(void) { return atomic_load(&ops); }

int ebb_file_fault_point(void) {
    atomic_fetch_add(&ops, 1);
    long long left = atomic_load(&fail_left);
    while (left > 0 && !atomic_compare_exchange_weak(&fail_left, &left, left - 1))
        ;
    if (left != 1)
        return 0;
    atomic_store(&fail_fired, 1);
    int err = atomic_load(&fail_err);
    return err ? err : EIO;
}
