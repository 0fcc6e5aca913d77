#pragma once
// ScriptLayer: one layer of a pipeline made from a TorchScript model. It runs
// TorchScript code (a submodule's forward, or a segment of the model's forward
// graph) and registers the TorchScript parameters and buffers it uses as its
// own: the same tensors, not copies. So gradients computed by the TorchScript
// code land in the .grad of what Pipeline::parameters() returns, an optimizer
// over those updates the TorchScript model, and Module::to(device), which
// rebinds each registered tensor's data in place, moves the TorchScript
// model's tensors with it.
//
// A layer of a whole submodule (a link of a chain) takes one tensor and
// passes one on: if the submodule returns a tuple, element 0 is kept and the
// rest dropped (as FirstOutput does for torch::nn::LSTM in ops/adapters.h).
// A segment of the forward takes the tensors live across the cut before it
// and returns those live across the cut after it (the last: every tensor of
// the model's output, a tuple's elements in order).
//
// Tied weights: a parameter this layer shares with a layer of another stage
// can be given a copy (rebind_parameter), which the layer registers and its
// TorchScript code then reads; the pipeline keeps the copies identical.
//
// Parameters keep their TorchScript names below the layer
// ("layer2.weight" inside a layer for "encoder"), each dotted name being a
// chain of registered submodules, so named_parameters() reads like the
// original model's. prefix() is where the layer's names start in the model
// ("encoder"; empty for a segment of the whole model's forward).
//
// The TorchScript graph executor runs unoptimized by default: each op then
// runs as in eager mode, with autograd's own backward formulas, so a step
// computes the same bits whether the code ran before or not. That makes
// gradients match an eager or unsplit reference and a resumed run match an
// uninterrupted one. ScriptLayerOptions::optimize turns the executor's
// optimizations (autodiff subgraphs, fusion) back on. (An executor keeps the
// plan it made first: code that already ran optimized elsewhere in the
// process, outside a ScriptLayer, may stay optimized.)

#include "ops/adapters.h"
#include "plugin/model/model_names.h"
#include "plugin/model/tied_parameters.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace conveyor {

struct ScriptLayerOptions {
  // Let the TorchScript graph executor optimize (see above).
  bool optimize = false;
};

class ScriptLayerImpl : public torch::nn::Module, public ModelPath, public TensorsLayer, public RebindsParameters {
 public:
  // The whole of `module`: its forward, all its parameters and buffers.
  // `prefix` is its path in the model it came from ("encoder.layer2").
  ScriptLayerImpl(torch::jit::Module module, std::string prefix, ScriptLayerOptions options = {});

  // Part of `owner`'s forward: `segment` takes (owner, x) and returns the
  // tensor passed on. `state` names the parameters and buffers the segment
  // reads (dotted, relative to owner) and `submodules` the submodules it
  // calls (their training flag follows train()). `description` says which
  // part of the forward this is, for messages. `fed` names those of `state`
  // that the segment takes as arguments after the tensors instead of reading
  // them from owner (weights tied to an earlier stage's): the layer passes
  // the tensors it registers under those names.
  ScriptLayerImpl(torch::jit::Module owner, std::shared_ptr<torch::jit::GraphFunction> segment,
                  const std::vector<std::string>& state, std::vector<std::string> submodules, std::string description,
                  ScriptLayerOptions options = {}, std::vector<std::string> fed = {});

  Tensors forward(Tensors inputs) override;
  int64_t num_inputs() const override;
  void rebind_parameter(const std::string& name, const at::Tensor& replacement) override;

  // Sets the training flag of the TorchScript code this layer runs (dropout,
  // batch norm read it) and of the registered holders.
  void train(bool on = true) override;

  // A deep copy: new TorchScript tensors, registered the same way.
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;

  void pretty_print(std::ostream& stream) const override;

  const std::string& prefix() const { return prefix_; }
  std::string model_path() const override { return prefix_; }

 private:
  void clone_(torch::nn::Module& other, const std::optional<torch::Device>& device) override;
  void register_state(const std::vector<std::string>& names);

  torch::jit::Module owner_;
  std::shared_ptr<torch::jit::GraphFunction> segment_;  // null: owner_'s forward
  std::vector<std::string> state_;                      // only for segments
  std::vector<std::string> submodules_;                 // only for segments
  std::vector<std::string> fed_;                        // only for segments
  std::vector<at::Tensor> fed_tensors_;                 // what this layer registers under fed_
  std::string prefix_;
  std::string description_;
  ScriptLayerOptions options_;
};

class ScriptLayer : public torch::nn::ModuleHolder<ScriptLayerImpl> {
 public:
  using torch::nn::ModuleHolder<ScriptLayerImpl>::ModuleHolder;
};

}  // namespace conveyor
