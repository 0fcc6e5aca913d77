#pragma once
// Stage: a contiguous slice of a Sequential's layers placed on one device. It
// shares the layer modules with the user's model (nothing is copied), and runs
// them one by one so that a failure names the layer that raised it. Between
// layers it passes a list of tensors (Tensors, ops/adapters.h): a plain layer
// takes exactly one, a TensorsLayer the whole list.
//
// Weights. The optimizer owns the stage's *live* weights. Normally those are
// the layers' own parameters. A schedule with weight stashing needs a
// backward to differentiate the version its forward read while the optimizer
// keeps updating: then the live weights are separate tensors, and before each
// forward or backward the layers' parameters are pointed (set_data, which
// leaves autograd's version counters alone) at the read-only copy that action
// must see. Between steps the parameters share the live weights' storage, so
// the user's model and inference always see the latest values.

#include "ops/adapters.h"
#include "plugin/model/stage_random.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class ShardedState;

// A read-only copy of a stage's weights, in parameter order.
struct WeightVersion {
  std::vector<at::Tensor> tensors;
  int64_t bytes() const;
};

class Stage {
 public:
  // `layers` are (name in the original Sequential, module); `first_layer` is
  // the index of layers[0] there. Moves the layers to `device`.
  Stage(int index, std::vector<std::pair<std::string, torch::nn::AnyModule>> layers, int64_t first_layer,
        c10::Device device);

  // Runs the layers in order. A failing layer is reported as
  // "layer 2 (torch::nn::Linear(...)): <what it said>"; the runtime adds the
  // stage, micro-batch and action. So is a layer given a number of tensors
  // it does not take.
  Tensors forward(Tensors inputs) const;
  // The same, and `outputs` (if given) receives every layer's outputs, in
  // order (the last entry is what forward returns): what a split backward
  // differentiates layer by layer.
  Tensors forward(Tensors inputs, std::vector<Tensors>* outputs) const;

  // Layer i's parameters that require grad (a tensor shared by several
  // layers is listed under each).
  const std::vector<at::Tensor>& layer_parameters(size_t i) const { return layer_params_.at(i); }
  // Whether some parameter is used by more than one of the stage's layers.
  bool shares_parameters_across_layers() const { return shared_across_layers_; }

  int index() const { return index_; }
  const c10::Device& device() const { return device_; }
  int64_t first_layer() const { return first_layer_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // The layers as a Sequential (same module objects, original names).
  torch::nn::Sequential module() const { return module_; }

  // --- weights -----------------------------------------------------------
  // The live weights (what an optimizer steps), with the layers' names. A
  // tensor registered twice in the stage's layers (weights tied within the
  // stage) is listed once, under its first name.
  const std::vector<at::Tensor>& live() const { return live_; }
  const std::vector<std::string>& names() const { return names_; }
  // Gives the optimizer its own live tensors (weight stashing); idempotent.
  void separate_live_weights();
  // A copy of the live weights as they are now.
  std::shared_ptr<WeightVersion> snapshot() const;
  // Points the layers' parameters at `version` / back at the live weights.
  void read_weights(const WeightVersion& version);
  void read_live_weights();
  // After a backward: moves the layers' gradients onto the live weights,
  // accumulating (a no-op when they are the same tensors).
  void collect_gradients();
  // The tensors whose .grad hold the stage's gradients for its update: the
  // live weights, or, where the optimizer shards the gradients across
  // replicas (ShardedState::gradient_pieces), its pieces of them.
  const std::vector<at::Tensor>& gradient_holders() const;
  // Their gradients that are defined (after collect_gradients()).
  std::vector<at::Tensor> gradients() const;
  // The live weights' gradients that are defined: with the gradients sharded,
  // what the backwards made since the last reduction; else gradients().
  std::vector<at::Tensor> made_gradients() const;
  // Drops every gradient, the layers', the live weights' and the holders'.
  void clear_gradients();
  // Overwrites the live weights' values (a rollback); the layers follow.
  void restore_live(const WeightVersion& version);

  // --- the stage's own optimizer (asynchronous schedules, or when the
  // pipeline was given one) -------------------------------------------------
  void set_optimizer(std::unique_ptr<torch::optim::Optimizer> optimizer) { optimizer_ = std::move(optimizer); }
  torch::optim::Optimizer* optimizer() const { return optimizer_.get(); }
  // Where the stage's replicas shard its parameters (shard "parameters"): its
  // optimizer, which gathers and releases them (ShardedState); else null.
  ShardedState* parameter_shards() const;
  // Number of optimizer steps this stage has taken, over the pipeline's life.
  int64_t updates() const { return updates_; }
  // Sets that count, when a checkpoint is loaded (see plugin/checkpoint/checkpoint.h).
  void restore_updates(int64_t updates) { updates_ = updates; }
  // One optimizer step with learning rate `lr` (negative: leave it), then
  // clears the gradients.
  void step(double lr);
  // An update by zero (a loss scaler's skipped step): clears the gradients
  // and counts the update, leaving the weights and the optimizer's state.
  void skip_step();

  // --- buffers a training forward changes in place (batch norm's running
  // statistics and batch count) ---------------------------------------------
  // Runs `replay` (a forward run again for its backward: recomputation,
  // offloading, features replay) and puts the stage's buffers back as they
  // were, so that a micro-batch counts once in them, as without replay. The
  // values are written into the same storage without bumping autograd's
  // version counters (batch norm does not bump them either).
  void without_buffer_changes(const std::function<void()>& replay) const;

  // --- the stage's own random streams (PipelineOptions::stage_rng) -------
  void enable_random(uint64_t seed) { random_ = std::make_unique<StageRandom>(seed, device_); }
  StageRandom* random() const { return random_.get(); }

 private:
  int index_;
  int64_t first_layer_;
  c10::Device device_;
  std::vector<std::pair<std::string, torch::nn::AnyModule>> layers_;
  std::vector<TensorsLayer*> tensors_layers_;  // per layer: itself if it takes a list, else null
  torch::nn::Sequential module_;
  std::vector<at::Tensor> params_;  // the layers' parameters, in order
  std::vector<std::vector<at::Tensor>> layer_params_;
  bool shared_across_layers_ = false;
  std::vector<std::string> names_;
  std::vector<at::Tensor> live_;
  bool separate_ = false;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t updates_ = 0;
  std::unique_ptr<StageRandom> random_;
};

}  // namespace conveyor
