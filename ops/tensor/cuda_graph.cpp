// CUDA graph capture and replay of whatever a callback launches. The plan
// side of it (what may be captured, the input and output buffers) is
// src/capture.c; this file knows streams and graphs, not plans. Compiled for
// real only against a libtorch with CUDA.
#include "shim.hpp"

#include "internal.h"

#ifdef EBB_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

struct ebb_cuda_graph {
    int device;
    at::cuda::CUDAGraph graph;
};

extern "C" ebb_status ebb_cuda_graph_capture(ebb_cuda_graph **out, int device,
                                             ebb_cuda_graph_body body, void *ctx) {
    *out = nullptr;
    ebb_cuda_graph *g = nullptr;
    ebb_status st = EBB_OK;
    try {
        g = new ebb_cuda_graph{device, {}};
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        // Warm up on a side stream first: libraries initialise lazily, and a
        // capture must not see that.
        c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
        {
            c10::cuda::CUDAStreamGuard sg(side);
            for (int w = 0; w < 2 && st == EBB_OK; w++)
                st = body(ctx, 0);
        }
        c10::cuda::device_synchronize();
        if (st == EBB_OK) {
            c10::cuda::CUDAStreamGuard sg(side);
            g->graph.capture_begin();
            st = body(ctx, 1);
            g->graph.capture_end();
        }
    } catch (...) {
        st = ebb::fail_from_exception("ebb_plan_capture");
    }
    if (st != EBB_OK) {
        delete g;
        return st;
    }
    *out = g;
    return EBB_OK;
}

extern "C" ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g) {
    try {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g->device));
        g->graph.replay();
    } catch (...) {
        return ebb::fail_from_exception("ebb_capture_replay");
    }
    return EBB_OK;
}

extern "C" void ebb_cuda_graph_free(ebb_cuda_graph *g) { delete g; }

#else /* no CUDA in this libtorch */

extern "C" ebb_status ebb_cuda_graph_capture(ebb_cuda_graph **out, int device,
                                             ebb_cuda_graph_body body, void *ctx) {
    (void)device;
    (void)body;
    (void)ctx;
    *out = nullptr;
    return ebb_error_set(EBB_ERR_UNSUPPORTED,
                         "ebb_plan_capture: this build of ebb has no CUDA (libtorch %s)",
                         ebb_torch_version());
}

extern "C" ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g) {
    (void)g;
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "ebb_capture_replay: this build of ebb has no CUDA");
}

extern "C" void ebb_cuda_graph_free(ebb_cuda_graph *g) { (void)g; }

#endif
