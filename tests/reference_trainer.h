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
// The pipelined runtime must reproduce these updates bit for bit. Models may
// pass lists of tensors between layers (TensorsLayer), as the pipeline does.

#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace conveyor::testing {

// The layers of `s` in order on a list, as a stage runs them.
inline Tensors forward_tensors(const torch::nn::Sequential& s, Tensors x) {
  for (const auto& layer : *s) {
    if (auto* list_layer = dynamic_cast<TensorsLayer*>(layer.ptr().get())) {
      x = list_layer->forward(std::move(x));
    } else {
      x = {torch::nn::AnyModule(layer).forward<at::Tensor>(x.at(0))};
    }
  }
  return x;
}

enum class Method { kStashed, kStashedVerticalSync, kFeaturesReplay };

// An asynchronous schedule and the reference method it must equal.
struct MethodCase {
  const char* schedule;
  bool vertical_sync;
  Method reference;
};

inline constexpr MethodCase kAsyncMethods[] = {{"pipedream", false, Method::kStashed},
                                               {"pipedream", true, Method::kStashedVerticalSync},
                                               {"ddg", false, Method::kStashed},
                                               {"fr", false, Method::kFeaturesReplay}};

class ReferenceTrainer {
 public:
  // `stages[k]` holds stage k's layers (modules of the reference model).
  // `max_norm` > 0 clips each stage's update by that stage's own norm
  // (clip_grad_norm_ over its parameters), as the pipeline clips an
  // asynchronous schedule's updates; `max_value` > 0 first clips each
  // gradient element to [-max_value, max_value] (clip_grad_value_).
  ReferenceTrainer(std::vector<torch::nn::Sequential> stages, Method method, const OptimizerFactory& optimizer,
                   LearningRateSchedule lr = nullptr, double max_norm = 0, double max_value = 0)
      : stages_(std::move(stages)), method_(method), lr_(std::move(lr)), max_norm_(max_norm), max_value_(max_value) {
    for (auto& s : stages_) optimizers_.push_back(optimizer(s->parameters()));
    updates_.assign(stages_.size(), 0);
  }

  // One train_step: the micro-batches are mini-batches, in order.
  void step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets, const LossFn& loss_fn) {
    std::vector<Tensors> in, tg;
    for (const auto& t : inputs) in.push_back({t});
    for (const auto& t : targets) tg.push_back({t});
    step(in, tg, [&](const Tensors& out, const Tensors& target) { return loss_fn(out[0], target[0]); });
  }

  void step(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets, const TensorsLossFn& loss_fn) {
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
        Tensors x = inputs[t];
        for (auto& s : stages_) x = forward_tensors(s, std::move(x));
        loss_fn(x, targets[t]).backward();
        for (int k = 0; k < num; ++k) load(k, history[k].back());
      }
      for (int k = 0; k < num; ++k) {
        if (lr_) {
          for (auto& g : optimizers_[k]->param_groups()) g.options().set_lr(lr_(updates_[k]));
        }
        if (max_value_ > 0) torch::nn::utils::clip_grad_value_(stages_[k]->parameters(), max_value_);
        if (max_norm_ > 0) torch::nn::utils::clip_grad_norm_(stages_[k]->parameters(), max_norm_);
        optimizers_[k]->step();
        optimizers_[k]->zero_grad(true);
        ++updates_[k];
        history[k].push_back(values(k));
      }
    }
  }

 private:
  void replay_step(const Tensors& input, const Tensors& target, const TensorsLossFn& loss_fn,
                   const std::vector<std::vector<std::vector<at::Tensor>>>& history, const std::vector<int>& version) {
    const int num = static_cast<int>(stages_.size());
    std::vector<Tensors> kept(num);
    {
      torch::NoGradGuard no_grad;
      Tensors x = input;
      for (int k = 0; k < num; ++k) {
        kept[k] = x;
        load(k, history[k][version[k]]);
        x = forward_tensors(stages_[k], x);
      }
    }
    for (int k = 0; k < num; ++k) load(k, history[k].back());
    Tensors delta;  // the gradient of stage k's outputs, a slot each
    for (int k = num - 1; k >= 0; --k) {
      Tensors x = kept[k];
      for (auto& t : x) {
        if (k > 0 && t.defined() && t.is_floating_point()) t = t.detach().requires_grad_(true);
      }
      const Tensors y = forward_tensors(stages_[k], x);
      if (k == num - 1) {
        loss_fn(y, target).backward();
      } else {
        Tensors roots, grads;
        for (size_t i = 0; i < y.size(); ++i) {
          if (y[i].defined() && y[i].requires_grad() && delta[i].defined()) {
            roots.push_back(y[i]);
            grads.push_back(delta[i]);
          }
        }
        if (!roots.empty()) torch::autograd::backward(roots, grads);
      }
      delta.assign(x.size(), at::Tensor());
      for (size_t i = 0; i < x.size(); ++i) {
        if (x[i].defined() && x[i].requires_grad()) delta[i] = x[i].grad();
      }
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
  double max_norm_ = 0;
  double max_value_ = 0;
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
