/* `ebb_bench precision`: the ebb side of the mixed-precision training rows
 * (tests/bench/precision.py); its protocol is at the top of bench_precision.c. */
#ifndef EBB_BENCH_PRECISION_H
#define EBB_BENCH_PRECISION_H

#ifdef __cplusplus
extern "C" {
#endif

/* Reads commands from stdin until "quit" or its end; returns the exit code. */
int bench_precision_main(void);

#ifdef __cplusplus
}
#endif
#endif
