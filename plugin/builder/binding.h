#pragma once
// conveyor::PipelineBinding: the one binding of conveyor::Pipeline
// (plugin/pipeline.h) by which Python reaches it. TorchScript code holds it
// as torch.classes.conveyor.Pipeline (torch_class.cpp registers it, raising
// ValueError for a bad argument); the conveyor package's _C.Pipeline
// (python/src/module.cpp) holds one too and adds what only Python has: its
// callables, the GIL released while the stages run, the step's report, and
// the package's own exceptions. The methods take and return what
// TorchScript passes (tensors, IValues, dicts) and throw what Pipeline
// throws.

#include "plugin/core/options.h"
#include "plugin/pipeline.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace conveyor {

class PipelineBinding : public torch::CustomClassHolder {
 public:
  explicit PipelineBinding(std::unique_ptr<Pipeline> built) : pipe_(std::move(built)) {}

  Pipeline& built() { return *pipe_; }
  const Pipeline& built() const { return *pipe_; }

  // One step: accumulates the batch's gradients into parameters()' .grad
  // (zero them first, as with loss.backward()), or steps the pipeline's own
  // optimizer, and returns the loss. A tensor or a tuple of tensors each.
  double train_step(const c10::IValue& input, const c10::IValue& target);
  // What the last train_step did: {"loss", "grad_norm", "loss_scale",
  // "skipped_updates", "stepped"}.
  c10::Dict<std::string, double> last_step() const;
  // Clips for a caller's own optimizer; returns the norm.
  double clip_grad_norm(double max_norm, double norm_type);
  // A tensor, or a tuple when the model returns several.
  c10::IValue forward(const c10::IValue& input);

  std::vector<at::Tensor> parameters() const { return pipe_->parameters(); }
  c10::Dict<std::string, at::Tensor> named_parameters() const;
  // Detached views of the parameters and buffers, named as in the model.
  c10::Dict<std::string, at::Tensor> state_dict() const;
  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state);

  void train(bool on) { pipe_->train(on); }
  int64_t num_stages() const { return pipe_->num_stages(); }
  std::string schedule() const { return pipe_->schedule().str(); }
  // The split, and with a profile the plan's predicted times and memory.
  std::string plan() const { return pipe_->plan_text(); }
  // What the fused_ops option swapped and left (swap_fused_ops' report).
  std::string fused_ops_report() const { return pipe_->fused_ops_report(); }

  // Weights, buffers, step and random generators; a torch.optim optimizer
  // keeps its own state_dict().
  void save_checkpoint(const std::string& path, int64_t step) const;
  int64_t load_checkpoint(const std::string& path);
  // The plain state dict ({name: tensor}), which torch.load reads.
  void save_model_state(const std::string& path) const;

 private:
  std::unique_ptr<Pipeline> pipe_;
};

}  // namespace conveyor
