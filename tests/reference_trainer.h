#pragma once
// The asynchronous methods written from their definitions, as plain
// sequential code on one device: no schedule, no threads, no runtime. Stage k
// of K (0-based) sees its updates d_k = K-1-k mini-batches late; within one
// train_step of M mini-batches the versions count from the step's start.
//
//  - PipeDream and DDG (weight stashing): mini-batch t is forwarded and
//    backwarded through the whole model with stage k's weights at version
//    max(0, t - d_k) (vertical sync: max(0, t - (K-1)) on every stage); the
//    gradient then updates the live weights, one optimizer step per stage.
//  - Features replay: the forward of t runs with those stale versions, but
//    the backward replays every stage's forward from its kept input with the
//    live weights (version t) before differentiating.
//
// The pipelined runtime must reproduce these updates bit for bit.

#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace conveyor::testing {

enum class Method { kStashed, kStashedVerticalSync, kFeaturesReplay };

class ReferenceTrainer {
 public:
  // `stages[k]` holds stage k's layers (modules of the reference model).
  ReferenceTrainer(std::vector<torch::nn::Sequential> stages, Method method, const OptimizerFactory& optimizer,
                   LearningRateSchedule lr = nullptr)
      : stages_(std::move(stages)), method_(method), lr_(std::move(lr)) {
    for (auto& s : stages_) optimizers_.push_back(optimizer(s->parameters()));
    updates_.assign(stages_.size(), 0);
  }

  // One train_step: the micro-batches are mini-batches, in order.
  void step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets, const LossFn& loss_fn) {
    const int num = static_cast<int>(stages_.size());
    // history[k][v]: stage k's weights after v updates in this step.
    std::vector<std::vector<std::vector<at::Tensor>>> history(num);
    for (int k = 0; k < num; ++k) history[k].push_back(values(k));
    for (size_t t = 0; t < inputs.size(); ++t) {
      std::vector<int> version(num);
      for (int k = 0; k < num; ++k) {
        const int delay = method_ == Method::kStashedVerticalSync ? num - 1 : num - 1 - k;
        version[k] = std::max(0, static_cast<int>(t) - delay);
      }
      if (method_ == Method::kFeaturesReplay) {
        replay_step(inputs[t], targets[t], loss_fn, history, version);
      } else {
        for (int k = 0; k < num; ++k) load(k, history[k][version[k]]);
        at::Tensor x = inputs[t];
        for (auto& s : stages_) x = s->forward(x);
        loss_fn(x, targets[t]).backward();
        for (int k = 0; k < num; ++k) load(k, history[k].back());
      }
      for (int k = 0; k < num; ++k) {
        if (lr_) {
          for (auto& g : optimizers_[k]->param_groups()) g.options().set_lr(lr_(updates_[k]));
        }
        optimizers_[k]->step();
        optimizers_[k]->zero_grad(true);
        ++updates_[k];
        history[k].push_back(values(k));
      }
    }
  }

 private:
  void replay_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn,
                   const std::vector<std::vector<std::vector<at::Tensor>>>& history, const std::vector<int>& version) {
    const int num = static_cast<int>(stages_.size());
    std::vector<at::Tensor> kept(num);
    {
      torch::NoGradGuard no_grad;
      at::Tensor x = input;
      for (int k = 0; k < num; ++k) {
        kept[k] = x;
        load(k, history[k][version[k]]);
        x = stages_[k]->forward(x);
      }
    }
    for (int k = 0; k < num; ++k) load(k, history[k].back());
    at::Tensor delta;
    for (int k = num - 1; k >= 0; --k) {
      at::Tensor x = k > 0 ? kept[k].detach().requires_grad_(true) : kept[k];
      at::Tensor y = stages_[k]->forward(x);
      if (k == num - 1) {
        loss_fn(y, target).backward();
      } else {
        y.backward(delta);
      }
      if (k > 0) delta = x.grad();
    }
  }

  std::vector<at::Tensor> values(int k) const {
    std::vector<at::Tensor> v;
    for (const auto& p : stages_[k]->parameters()) v.push_back(p.detach().clone());
    return v;
  }

  void load(int k, const std::vector<at::Tensor>& v) {
    torch::NoGradGuard no_grad;
    const auto params = stages_[k]->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(v[i]);
  }

  std::vector<torch::nn::Sequential> stages_;
  Method method_;
  LearningRateSchedule lr_;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> optimizers_;
  std::vector<int64_t> updates_;
};

// Cuts `model` into stages at the same points a Pipeline with `num_stages`
// uniform stages would (the modules are shared, not copied).
inline std::vector<torch::nn::Sequential> split_like_pipeline(const torch::nn::Sequential& model, int num_stages) {
  const auto boundaries = uniform_boundaries(static_cast<int64_t>(model->size()), num_stages);
  std::vector<torch::nn::Sequential> stages(num_stages);
  const auto children = model->named_children();
  int k = 0;
  int64_t i = 0;
  for (const auto& layer : *model) {
    if (k < num_stages - 1 && i == boundaries[k]) ++k;
    stages[k]->push_back(children[i++].key(), layer);
  }
  return stages;
}

}  // namespace conveyor::testing
