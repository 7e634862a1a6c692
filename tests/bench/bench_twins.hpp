// Hand-written libtorch C++ twins of the bench workloads: the same ATen
// calls, in the same order, on the same parameter tensors as ebb's plan.
// They are the floor for dispatch overhead on the same kernels.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace bench {

// Parameters in ebb's plan order, with their full names.
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;
using Forward = std::function<at::Tensor(const at::Tensor &)>;

// Builds the twin of `workload` over `params` (consumed in plan order and
// checked by name); `cfg` holds the spec's params ("heads" -> 4). With
// `train`, the forward is the training one (dropout drawn, batch_norm on
// batch statistics, updating its running ones). Throws std::runtime_error
// when the parameters do not fit.
Forward make_twin(const std::string &workload, const NamedParams &params,
                  const std::map<std::string, long> &cfg, bool train = false);

// The twin of a training step, as a libtorch C++ user writes one: the
// trained parameters are leaves with requires_grad, the loss's backward()
// fills their .grad, torch::optim::AdamW (lr 1e-3, defaults otherwise)
// updates them, and the gradients are dropped before the next step
// (zero_grad with set_to_none), so they live only inside a step, as ebb's.
class TrainTwin {
  public:
    // `params` in plan order (copies: the twin trains them); `trained[i]`
    // says which get gradients (the others are buffers). `y` holds class
    // indices (int64) for cross_entropy, else the mse target.
    TrainTwin(const std::string &workload, const NamedParams &params,
              const std::vector<bool> &trained, const std::map<std::string, long> &cfg,
              const at::Tensor &x, const at::Tensor &y, const std::string &loss);
    ~TrainTwin();
    // Drops the last step's gradients (outside a timed region, as the
    // baseline of a peak measurement).
    void drop_grads();
    // One step: drop gradients, forward, loss, backward, update. Returns the
    // loss when read_loss (a host read), else 0.
    double step(bool read_loss);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace bench
