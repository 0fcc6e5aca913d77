#include "plugin/model/model_snapshot.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include <mutex>

namespace conveyor {

std::vector<at::Generator> default_generators() {
  std::vector<at::Generator> gens{at::detail::getDefaultCPUGenerator()};
  if (torch::cuda::is_available()) {
    for (c10::DeviceIndex i = 0; i < static_cast<c10::DeviceIndex>(torch::cuda::device_count()); ++i) {
      gens.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, i)));
    }
  }
  return gens;
}

ModelSnapshot::ModelSnapshot(const torch::nn::Sequential& model, bool weights)
    : model_(model), generators_(default_generators()) {
  for (const auto& p : model->parameters()) {
    if (weights) weights_.push_back(p.detach().clone());
    grads_.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  }
  for (const auto& b : model->buffers()) buffers_.push_back(b.defined() ? b.detach().clone() : at::Tensor());
  for (auto& g : generators_) {
    std::lock_guard<std::mutex> lock(g.mutex());
    states_.push_back(g.get_state());
  }
}

void ModelSnapshot::restore() const {
  torch::NoGradGuard no_grad;
  const auto params = model_->parameters();
  for (size_t i = 0; i < params.size() && i < grads_.size(); ++i) {
    at::Tensor p = params[i];
    if (!weights_.empty()) p.set_data(weights_[i].clone());
    p.mutable_grad() = grads_[i].defined() ? grads_[i].to(p.device(), /*non_blocking=*/false, /*copy=*/true)
                                           : at::Tensor();
  }
  const auto buffers = model_->buffers();
  for (size_t i = 0; i < buffers.size() && i < buffers_.size(); ++i) {
    at::Tensor b = buffers[i];
    if (!buffers_[i].defined() || !b.defined()) continue;
    if (weights_.empty()) {
      b.copy_(buffers_[i]);
    } else {
      b.set_data(buffers_[i].clone());
    }
  }
  for (size_t i = 0; i < generators_.size(); ++i) {
    at::Generator g = generators_[i];
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(states_[i]);
  }
}

}  // namespace conveyor
