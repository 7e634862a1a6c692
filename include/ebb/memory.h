/*
 * ebb/memory.h - allocator-measured tensor memory, the instrument ebb is
 * judged by.
 *
 * On the CPU, ebb_init() installs an accounting allocator in front of
 * libtorch's default one, so every byte of tensor storage is counted exactly
 * when it is allocated and when it is freed. On CUDA the figures come from the
 * caching allocator's allocated-bytes statistics (block-rounded, see
 * docs/memory.md).
 *
 *     ebb_memory_reset_peak(dev);
 *     ... run ...
 *     ebb_memory_stats s; ebb_memory_stats_get(dev, &s);
 *     printf("peak %lld bytes\n", (long long)s.peak_bytes);
 *
 * The counters are process-wide: two threads running at once see each other's
 * allocations.
 *
 * Whether a plan's run will fit in what the process can still get (address
 * space and data limits, its cgroup, MemAvailable) is answered before running
 * by ebb_plan_check_fits() in run.h.
 */
#ifndef EBB_MEMORY_H
#define EBB_MEMORY_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_memory_stats {
    int64_t current_bytes; /* tensor storage allocated now */
    int64_t peak_bytes;    /* highest current_bytes since the last reset */
    int64_t allocations;   /* allocations since ebb_init() */
    int64_t frees;         /* frees since ebb_init() */
    int64_t reserved_bytes; /* CUDA: held by the caching allocator (>= current);
                               CPU: equal to current_bytes */
} ebb_memory_stats;

/* Reads the counters of one device. EBB_ERR_UNSUPPORTED for CUDA in a build
 * without it; NULL out: EBB_ERR_ARG. */
EBB_API ebb_status ebb_memory_stats_get(ebb_device device, ebb_memory_stats *out);

/* Bytes of tensor storage allocated on the device right now (0 on error). */
EBB_API int64_t ebb_memory_current(ebb_device device);

/* Sets the device's peak to its current bytes. */
EBB_API void ebb_memory_reset_peak(ebb_device device);

/* What a CUDA device can still give this process: the driver's free bytes
 * (cudaMemGetInfo) plus what the caching allocator holds unallocated, which
 * it hands out again before asking the driver; `total` (may be NULL) gets
 * the device's size. EBB_ERR_UNSUPPORTED for the CPU (see
 * ebb_plan_check_fits() for its limits) and for CUDA in a build without it;
 * a CUDA error (no such device) is EBB_ERR_TORCH. */
EBB_API ebb_status ebb_device_memory_available(ebb_device device, int64_t *available,
                                               int64_t *total);

/* Makes the libraries' per-stream state on the device before a run measures
 * anything: on CUDA, the cuBLAS (and cuBLASLt) handle of the calling thread
 * and its workspace on the current stream, which libtorch otherwise creates
 * at a run's first matrix product (about 33 MiB on an H100/H200 with
 * libtorch 2.11) and which it keeps for the process's life. ebb_run calls it,
 * so that those bytes are a fixed cost beside the parameters and not an
 * intermediate that the plan never saw. `bytes` (may be NULL) gets what the
 * workspaces took when this thread and stream first prepared them (0 on the
 * CPU, and on a stream being captured into a CUDA graph, whose workspace comes
 * from the graph's own pool). */
EBB_API ebb_status ebb_device_prepare(ebb_device device, int64_t *bytes);

/* Number of live ebb_tensor handles in the process. Every test checks that it
 * returns to zero. */
EBB_API int64_t ebb_tensor_live_count(void);

/* ---- fault injection: a testing aid -------------------------------------- */

/* Makes the n-th CPU tensor allocation from now on fail (1: the next one) as
 * a real out-of-memory does: the accounting allocator throws std::bad_alloc
 * inside libtorch, and the ebb call that asked reports EBB_ERR_NOMEM. Only
 * that allocation fails; the injector then disarms itself. n <= 0 disarms it.
 * Allocations are counted as ebb_memory_stats.allocations counts them
 * (zero-byte ones are not), process-wide. For tests that make every
 * allocation of an operation fail in turn, as SQLite's tests do
 * (tests/test_faults.c). */
EBB_API void ebb_memory_fail_nth(int64_t n);

/* Non-zero once the failure armed by the last ebb_memory_fail_nth() has
 * happened. */
EBB_API int ebb_memory_fail_fired(void);

#ifdef __cplusplus
}
#endif
#endif /* EBB_MEMORY_H */
