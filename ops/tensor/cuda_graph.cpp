// CUDA graph capture and replay of whatever a callback launches. The plan
// side of it (what may be captured, the input and output buffers) is
// src/capture.c; this file knows streams and graphs, not plans. Compiled for
// real only against a libtorch with CUDA.
#include "shim.hpp"

#include "internal.h"

#include <string>
#include <vector>

#ifdef EBB_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

// A graph and the random generators its kernels draw from. Each seeded
// draw (dropout's mask) makes a generator of its own, seeded for its call;
// in a graph those generators are made once, registered with the graph
// before capture, and reseeded before each replay, so that a replay draws
// what an eager run with the same seeds would.
struct ebb_cuda_graph {
    int device;
    at::cuda::CUDAGraph graph;
    std::vector<at::Generator> gens;
    std::vector<uint64_t> seeds; // each generator's seed at capture
};

namespace {
// The capture under way on this thread: the warm-up runs make and keep the
// generators (recording), the recorded run takes them back in order.
struct rng_session {
    ebb_cuda_graph *g = nullptr;
    bool recording = false;
    size_t next = 0;
};
thread_local rng_session session;
} // namespace

namespace ebb {
at::Generator seeded_cuda_generator(int device, uint64_t seed) {
    rng_session &s = session;
    if (s.g && !s.recording) {
        if (s.next >= s.g->gens.size() || s.g->seeds[s.next] != seed)
            throw std::runtime_error("a random draw under capture differs from the warm-up "
                                     "run's (draw " + std::to_string(s.next) + ")");
        return s.g->gens[s.next++];
    }
    at::Generator gen = at::cuda::detail::createCUDAGenerator(static_cast<c10::DeviceIndex>(device));
    gen.set_current_seed(seed);
    if (s.g) {
        s.g->gens.push_back(gen);
        s.g->seeds.push_back(seed);
    }
    return gen;
}
bool cuda_capturing() {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}
} // namespace ebb

extern "C" ebb_status ebb_cuda_graph_capture(ebb_cuda_graph **out, int device,
                                             ebb_cuda_graph_body body, void *ctx) {
    *out = nullptr;
    ebb_cuda_graph *g = nullptr;
    ebb_status st = EBB_OK;
    try {
        g = new ebb_cuda_graph{device, {}, {}, {}};
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        // Warm up on a side stream first: libraries initialise lazily, and a
        // capture must not see that.
        c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
        session = rng_session{g, true, 0};
        {
            c10::cuda::CUDAStreamGuard sg(side);
            for (int w = 0; w < 2 && st == EBB_OK; w++) {
                g->gens.clear(); // the last warm-up's draws are the graph's
                g->seeds.clear();
                st = body(ctx, 0);
            }
        }
        c10::cuda::device_synchronize();
        if (st == EBB_OK) {
            for (size_t i = 0; i < g->gens.size(); i++) {
                g->gens[i].set_current_seed(g->seeds[i]);
                g->graph.register_generator_state(g->gens[i]);
            }
            session.recording = false;
            c10::cuda::CUDAStreamGuard sg(side);
            g->graph.capture_begin();
            try {
                st = body(ctx, 1);
            } catch (...) {
                g->graph.capture_end();
                throw;
            }
            g->graph.capture_end();
            if (st == EBB_OK && session.next != g->gens.size())
                st = ebb_error_set(EBB_ERR_RUNTIME,
                                   "ebb_cuda_graph_capture: the recorded run made %zu random "
                                   "draws, the warm-up %zu",
                                   session.next, g->gens.size());
        }
    } catch (...) {
        st = ebb::fail_from_exception("ebb_plan_capture");
    }
    session = rng_session{};
    if (st != EBB_OK) {
        delete g;
        return st;
    }
    *out = g;
    return EBB_OK;
}

extern "C" int ebb_cuda_graph_draws(const ebb_cuda_graph *g, const uint64_t **seeds) {
    *seeds = g->seeds.data();
    return static_cast<int>(g->seeds.size());
}

extern "C" ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g, const uint64_t *seeds) {
    try {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(g->device));
        // a generator reseeded starts at offset 0, as a fresh one does
        for (size_t i = 0; i < g->gens.size(); i++)
            g->gens[i].set_current_seed(seeds ? seeds[i] : g->seeds[i]);
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

extern "C" int ebb_cuda_graph_draws(const ebb_cuda_graph *g, const uint64_t **seeds) {
    (void)g;
    *seeds = nullptr;
    return 0;
}

extern "C" ebb_status ebb_cuda_graph_replay(ebb_cuda_graph *g, const uint64_t *seeds) {
    (void)g;
    (void)seeds;
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "ebb_capture_replay: this build of ebb has no CUDA");
}

extern "C" void ebb_cuda_graph_free(ebb_cuda_graph *g) { (void)g; }

#endif
