#pragma once
// ExportLayer: one layer of a pipeline made from a torch.export program: a
// segment of its graph (plugin/export/segments.h) run by the interpreter
// (plugin/export/interpreter.h). It registers the parameters and buffers its
// nodes read under the model's names ("layers.0.linear1.weight", one holder
// module per path component), so Pipeline::parameters(), checkpoints and
// state dicts read like the original model's; Module::to(device) moves them,
// and tensors the graph creates are made on the layer's device.
//
// A tensor read by the segments of several stages (tied weights) is
// registered in each; the pipeline gives every later stage a copy
// (rebind_parameter) and keeps the copies equal.
//
// Symbolic sizes that an earlier segment computed (the batch size of a
// dynamic batch) travel as 0-dim tensors.

#include "ops/adapters.h"
#include "plugin/export/program.h"
#include "plugin/export/segments.h"
#include "plugin/model/tied_parameters.h"
#include "plugin/model/model_names.h"

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace conveyor {

class ExportLayerImpl : public torch::nn::Module, public ModelPath, public TensorsLayer, public RebindsParameters {
 public:
  // `tensors`: every parameter, buffer and constant of the program, by name
  // (the layer registers those of `segment`, the same tensors).
  ExportLayerImpl(std::shared_ptr<const exported::Program> program, exported::Segment segment,
                  const std::map<std::string, at::Tensor>& tensors, std::string where);

  Tensors forward(Tensors inputs) override;
  int64_t num_inputs() const override { return static_cast<int64_t>(segment_.inputs.size()); }
  void rebind_parameter(const std::string& name, const at::Tensor& replacement) override;
  std::string model_path() const override { return ""; }

  // A deep copy: new tensors, registered the same way.
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;

  const exported::Segment& segment() const { return segment_; }

 private:
  void clone_(torch::nn::Module& other, const std::optional<torch::Device>& device) override;
  void check_inputs(const Tensors& inputs) const;

  std::shared_ptr<const exported::Program> program_;
  exported::Segment segment_;
  std::string where_;
  std::vector<std::pair<int, at::Tensor>> state_;  // (slot, registered tensor)
  std::vector<std::string> state_names_;           // by state_ entry
  std::vector<bool> constant_;                     // by state_ entry: not registered
  std::vector<bool> mutated_;                      // by state_ entry: a buffer the signature returns anew
};

class ExportLayer : public torch::nn::ModuleHolder<ExportLayerImpl> {
 public:
  using torch::nn::ModuleHolder<ExportLayerImpl>::ModuleHolder;
};

}  // namespace conveyor
