/* The scratch of libtorch's CUDA sums, shared by the ops' CUDA figures. */
#include "ops_internal.h"

/* A sum over the rows of a contiguous [rows, cols] (cols = 1: over every
 * element) follows setReduceConfig in ATen's Reduce.cuh. A thread block is
 * bw x bh threads, up to 512; with cols > 1 each thread takes up to four
 * outputs (vec) and the threads of a column split its rows; with cols = 1
 * the lanes read four elements at a time along the input. When a thread
 * would still sum 256 values or more, the rows are split across thread
 * blocks too (ctas per output column): they stage acc bytes per output,
 * block and lane, and count themselves in one int per column of blocks,
 * two allocations freed with the call.
 *
 * How far the rows are split is capped by the device's multiprocessors
 * (ceil(threads the device holds / threads of the grid)); the figure takes
 * the split before that cap, ceil(values per thread / 16), the most any
 * device makes. It is exact while the cap does not bind: on an H100 or
 * H200 (132 multiprocessors) up to about 17 million values summed, above
 * which it over-counts. */
int64_t ebb_ops_cuda_sum_staging(int64_t rows, int64_t cols, int64_t acc) {
    if (rows < 2 || cols < 1)
        return 0;
    int full = cols == 1;
    int64_t vec = 1, dim0, dim1;
    if (full) {
        dim0 = rows >= 128 ? rows / 4 : rows; /* four elements per load */
        dim1 = 1;
    } else {
        vec = 4;
        while (cols % vec != 0)
            vec /= 2;
        dim0 = cols / vec;
        dim1 = rows;
    }
    int64_t most = 512 / vec;
    int64_t p0 = dim0 < most ? ebb_ops_pow2_floor(dim0) : most;
    int64_t p1 = dim1 < most ? ebb_ops_pow2_floor(dim1) : most;
    int64_t bw = p0 < 32 ? p0 : 32;
    int64_t bh = p1 < most / bw ? p1 : most / bw;
    bw = p0 < most / bh ? p0 : most / bh;
    int64_t step_in = full ? bw : 1, step_out = full ? 1 : bw;
    int64_t per_thread = ebb_ops_ceil_div(rows, step_in);
    if (per_thread < (bh * 16 < 256 ? bh * 16 : 256))
        return 0; /* each warp sums outputs of its own */
    per_thread = ebb_ops_ceil_div(rows, step_in * bh);
    if (per_thread < 256)
        return 0;
    int64_t ctas = ebb_ops_ceil_div(per_thread, 16);
    int64_t columns = ebb_ops_ceil_div(cols / vec, step_out);
    int64_t staging = acc * cols * ctas * (full ? 1 : bw * vec);
    return ebb_cuda_block(staging) + ebb_cuda_block(4 * columns);
}
