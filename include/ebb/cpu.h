/* The CPU's kernels and threads: which vector code libtorch runs here, and
 * how many intra-op threads it uses.
 *
 *     ebb_cpu_info ci;
 *     ebb_cpu_info_get(&ci);
 *     printf("%d threads, ATen %s, oneDNN %s, %s\n", ci.threads, ci.aten, ci.onednn, ci.blas);
 *     if (!ci.bf16_native)
 *         puts("bfloat16 saves bytes here, not time");
 *
 * Three libraries pick their kernels from the CPU, and each takes a cap from
 * the environment, which is how a test sees what an older CPU would run:
 *   ATen's vectorised loops  ATEN_CPU_CAPABILITY=default|avx2|avx512
 *   oneDNN                   ONEDNN_MAX_CPU_ISA=AVX2 (DNNL_MAX_CPU_ISA before 3.0)
 *   OpenBLAS (Debian's)      OPENBLAS_CORETYPE=Haswell
 *   MKL (pip's torch)        MKL_ENABLE_INSTRUCTIONS=AVX2
 */
#ifndef EBB_CPU_H
#define EBB_CPU_H

#include "ebb/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ebb_cpu_info {
    int threads;       /* libtorch's intra-op threads (ebb_set_num_threads) */
    char aten[16];     /* ATen's vector kernels: "AVX512", "AVX2", "NO AVX", ... */
    char onednn[24];   /* oneDNN's instruction set after its cap: "avx2", "avx512_core_amx", ... */
    char blas[48];     /* the BLAS and its kernels: "OpenBLAS Haswell", "MKL AVX2", ... */
    int bf16_native;   /* the CPU computes bfloat16 products itself (AVX512_BF16 or AMX),
                          as oneDNN uses it: bf16 then saves time as well as bytes */
    int fp16_native;   /* the same for float16 (AVX512_FP16 or AMX-FP16) */
    int bf16_usable;   /* 0 where libtorch's bfloat16 CPU kernels fail outright: libtorch
                          1.13 hands bfloat16 to oneDNN by the CPU's own flags, so a
                          ONEDNN_MAX_CPU_ISA below AVX-512 on an AVX-512 CPU refuses it */
    int fp16_usable;   /* 0 where libtorch has no float16 matrix product on the CPU
                          (Debian's 1.13 has no Half addmm on the CPU) */
} ebb_cpu_info;

/* Fills *out with this process's CPU kernels (after ebb_init). EBB_ERR_ARG
 * for a NULL out. */
EBB_API ebb_status ebb_cpu_info_get(ebb_cpu_info *out);

/* One line for people: "2 threads; kernels ATen AVX2, oneDNN avx2, OpenBLAS
 * Haswell; no native bfloat16 or float16" (always NUL-terminated unless size
 * is 0); returns buf. */
EBB_API const char *ebb_cpu_info_str(const ebb_cpu_info *ci, char *buf, size_t size);

/* Sets libtorch's intra-op threads, as torch.set_num_threads. Plans size
 * some kernels' scratch by the thread count, so set it before compiling.
 * ebb_init sets it from EBB_NUM_THREADS when that is set (and not to a
 * positive integer: an error from ebb_init, naming it); otherwise
 * ebb_default_num_threads() is used. EBB_ERR_ARG outside 1..1024. */
EBB_API ebb_status ebb_set_num_threads(int n);

/* The thread count ebb_init chooses without EBB_NUM_THREADS: one per core
 * that the 1-minute load average leaves idle, at least 1 and at most
 * libtorch's own default (one per physical core); libtorch's count as it
 * stands where OMP_NUM_THREADS is set (docs/cli.md, "Threads", says why). */
EBB_API int ebb_default_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif
