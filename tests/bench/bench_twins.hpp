// Hand-written libtorch C++ twins of the bench workloads: the same ATen
// calls, in the same order, on the same parameter tensors as ebb's plan.
// They are the floor for dispatch overhead on the same kernels.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace bench {

// Parameters in ebb's plan order, with their full names.
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;
using Forward = std::function<at::Tensor(const at::Tensor &)>;

// Builds the twin of `workload` over `params` (consumed in plan order and
// checked by name); `cfg` holds the spec's params ("heads" -> 4). Throws
// std::runtime_error when the parameters do not fit.
Forward make_twin(const std::string &workload, const NamedParams &params,
                  const std::map<std::string, long> &cfg);

} // namespace bench
