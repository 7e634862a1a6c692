// The hand-written libtorch twin of a training step: the twin's forward
// (bench_twins.cpp, in its training form) under libtorch autograd, the loss,
// loss.backward(), torch::optim::AdamW. Kept apart from the forward twins
// because the C++ frontend's optimizer headers are heavy to compile. A
// language model's per-token loss is cross_entropy over the flattened
// [B*T, V] logits, as nanoGPT computes it.
#include "bench_twins.hpp"

#include <stdexcept>

#include <torch/optim/adamw.h>

namespace bench {

struct TrainTwin::Impl {
    std::vector<at::Tensor> trained; // leaves with requires_grad
    Forward forward;
    at::Tensor x, y;
    bool classes = false;
    std::unique_ptr<torch::optim::AdamW> opt;
};

TrainTwin::TrainTwin(const std::string &workload, const NamedParams &params,
                     const std::vector<bool> &trained, const std::map<std::string, long> &cfg,
                     const at::Tensor &x, const at::Tensor &y, const std::string &loss)
    : impl_(new Impl) {
    if (trained.size() != params.size())
        throw std::runtime_error("trained flags do not match the parameters");
    if (loss != "cross_entropy" && loss != "mse")
        throw std::runtime_error("no C++ twin for the loss '" + loss + "'");
    NamedParams own;
    for (size_t i = 0; i < params.size(); i++) {
        at::Tensor p = params[i].second.clone();
        if (trained[i]) {
            p.requires_grad_(true);
            impl_->trained.push_back(p);
        }
        own.emplace_back(params[i].first, p);
    }
    impl_->forward = make_twin(workload, own, cfg, true);
    impl_->classes = loss == "cross_entropy";
    impl_->x = x;
    impl_->y = impl_->classes ? y.to(at::kLong) : y;
    impl_->opt.reset(new torch::optim::AdamW(impl_->trained, torch::optim::AdamWOptions(1e-3)));
}

TrainTwin::~TrainTwin() = default;

void TrainTwin::drop_grads() {
    for (at::Tensor &p : impl_->trained)
        p.mutable_grad().reset();
}

double TrainTwin::step(bool read_loss) {
    drop_grads();
    at::Tensor out = impl_->forward(impl_->x);
    at::Tensor loss;
    if (impl_->classes && out.dim() == 3) // per token: logits [B, T, V], classes [B, T]
        loss = at::cross_entropy_loss(out.view({-1, out.size(-1)}), impl_->y.view({-1}));
    else
        loss = impl_->classes ? at::cross_entropy_loss(out, impl_->y)
                              : at::mse_loss(out, impl_->y);
    out = at::Tensor();
    loss.backward();
    impl_->opt->step();
    return read_loss ? loss.item<double>() : 0.0;
}

} // namespace bench
