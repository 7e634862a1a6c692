// CUDA graph capture and replay of a whole plan (see ebb_plan_capture in
// ebb/run.h). Compiled for real only against a libtorch with CUDA.
#include "shim.hpp"

#include "ebb/run.h"
#include "internal.h"

#ifdef EBB_WITH_CUDA
#include <vector>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

struct ebb_capture {
    const ebb_plan *plan;
    const ebb_model *model;
    at::cuda::CUDAGraph graph;
    std::vector<ebb_tensor *> in, out;
};

static void release(ebb_capture *c) {
    for (ebb_tensor *t : c->in)
        ebb_tensor_free(t);
    for (ebb_tensor *t : c->out)
        ebb_tensor_free(t);
    delete c;
}

extern "C" ebb_status ebb_cuda_graph_capture(ebb_capture **out, const ebb_plan *plan,
                                             const ebb_model *model, ebb_tensor *const *inputs) {
    int n_in = ebb_plan_input_count(plan), n_out = ebb_plan_output_count(plan);
    ebb_capture *c = nullptr;
    ebb_status st = EBB_OK;
    try {
        c = new ebb_capture{plan, model, {}, {}, {}};
        c->in.assign(static_cast<size_t>(n_in), nullptr);
        c->out.assign(static_cast<size_t>(n_out), nullptr);
        ebb_device dev = ebb_model_device(model);
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(dev.index));
        for (int i = 0; i < n_in && st == EBB_OK; i++)
            st = ebb_tensor_clone(&c->in[static_cast<size_t>(i)], inputs[i]);
        // Warm up on a side stream first: libraries initialise lazily, and a
        // capture must not see that.
        c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
        {
            c10::cuda::CUDAStreamGuard sg(side);
            for (int w = 0; w < 2 && st == EBB_OK; w++) {
                st = ebb_run(plan, model, c->in.data(), c->out.data(), nullptr);
                for (auto &t : c->out) {
                    ebb_tensor_free(t);
                    t = nullptr;
                }
            }
        }
        c10::cuda::device_synchronize();
        if (st == EBB_OK) {
            c10::cuda::CUDAStreamGuard sg(side);
            c->graph.capture_begin();
            st = ebb_run(plan, model, c->in.data(), c->out.data(), nullptr);
            c->graph.capture_end();
        }
    } catch (...) {
        st = ebb::fail_from_exception("ebb_plan_capture");
    }
    if (st != EBB_OK) {
        if (c)
            release(c);
        return st;
    }
    *out = c;
    return EBB_OK;
}

extern "C" ebb_status ebb_capture_replay(ebb_capture *c, ebb_tensor *const *inputs,
                                         ebb_tensor **outputs) {
    if (!c || !outputs || (!c->in.empty() && !inputs))
        return ebb_error_set(EBB_ERR_ARG, "ebb_capture_replay: capture, inputs and outputs are required");
    try {
        for (size_t i = 0; i < c->in.size(); i++) {
            if (!inputs[i]->t.sizes().equals(c->in[i]->t.sizes()))
                return ebb_error_set(EBB_ERR_SHAPE,
                                     "ebb_capture_replay: input %zu changed shape since capture", i);
            c->in[i]->t.copy_(inputs[i]->t, /*non_blocking=*/true);
        }
        c->graph.replay();
        for (size_t k = 0; k < c->out.size(); k++) {
            outputs[k] = nullptr;
            ebb_status st = ebb_tensor_ref(&outputs[k], c->out[k]);
            if (st != EBB_OK) {
                for (size_t j = 0; j < k; j++)
                    ebb_tensor_free(outputs[j]);
                return st;
            }
        }
    } catch (...) {
        return ebb::fail_from_exception("ebb_capture_replay");
    }
    return EBB_OK;
}

extern "C" void ebb_capture_free(ebb_capture *c) {
    if (c)
        release(c);
}

#else /* no CUDA in this libtorch */

extern "C" ebb_status ebb_cuda_graph_capture(ebb_capture **out, const ebb_plan *plan,
                                             const ebb_model *model, ebb_tensor *const *inputs) {
    (void)out;
    (void)plan;
    (void)model;
    (void)inputs;
    return ebb_error_set(EBB_ERR_UNSUPPORTED,
                         "ebb_plan_capture: this build of ebb has no CUDA (libtorch %s)",
                         ebb_torch_version());
}

extern "C" ebb_status ebb_capture_replay(ebb_capture *c, ebb_tensor *const *inputs,
                                         ebb_tensor **outputs) {
    (void)c;
    (void)inputs;
    (void)outputs;
    return ebb_error_set(EBB_ERR_UNSUPPORTED, "ebb_capture_replay: this build of ebb has no CUDA");
}

extern "C" void ebb_capture_free(ebb_capture *c) { (void)c; }

#endif
