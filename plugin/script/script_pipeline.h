#pragma once
// ScriptPipeline: a pipeline over a TorchScript model configured by a dict of
// options, as Python hands them over. Both ways in from Python build on it:
// the `conveyor` package's extension module (python/src/module.cpp), which
// adds Python callables for the loss and the learning rate, and the
// TorchScript class torch.classes.conveyor.Pipeline (python_class.cpp).
//
// Options: the dict's keys are the rows of PipelineOptions
// (plugin/option_list.h), BuildOptions (plugin/script/build_options.h) and
// DistributedOptions, each value of its row's type (read by
// plugin/script/python_options.h); and two that are objects: loss
// ("cross_entropy" over the last dimension | "mse" | a scripted module called
// as loss(*outputs, *targets)) and sample (an (input, target) batch whose
// first micro-batch is profiled: balance "time" and plan "auto" need it; the
// plan then predicts the step). Every error in the options is a
// std::invalid_argument naming the option (OptionTypeError for a value of the
// wrong type).
//
// Across processes: given ProcessGroups (torch.distributed's groups, handed
// over by the conveyor package), each process builds the same pipeline and
// runs its worker's stages over a DistributedPipeline (one worker per
// process, D data-parallel replicas); parameters and state are then this
// process's stages'.

#include "plugin/distributed/distributed_pipeline.h"
#include "plugin/options.h"
#include "plugin/pipeline.h"
#include "plugin/planner/planner.h"
#include "plugin/script/build_options.h"
#include "plugin/script/python_options.h"
#include "plugin/step_result.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

using ScriptOptions = c10::Dict<std::string, c10::IValue>;

// The option names ScriptPipeline accepts, sorted.
const std::set<std::string>& script_pipeline_options();

class ScriptPipeline {
 public:
  // `model`: a TorchScript module, or the path of one saved with
  // torch.jit.save. `customize` (if given) runs after the options are read
  // and before the pipeline is built: it may set what a dict cannot carry
  // (a loss function, a learning-rate schedule).
  using Customize = std::function<void(PipelineOptions&, TensorsLossFn& loss)>;
  // `text`: whether numbers and bools may come as strings (ValueText::kOrText).
  ScriptPipeline(const c10::IValue& model, const ScriptOptions& options, const Customize& customize = nullptr,
                 std::shared_ptr<ProcessGroups> groups = nullptr, ValueText text = ValueText::kOrText);

  // One step; gradients accumulate into parameters()' .grad (or the
  // pipeline's optimizer steps). The result is also kept as last_step().
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets);
  const StepResult& last_step() const { return last_; }
  // Inference; across processes the output is on the last stage's process,
  // an empty list elsewhere.
  Tensors forward(const Tensors& inputs);
  // Clips the gradients' global norm (across processes too); returns it.
  double clip_grad_norm(double max_norm, double norm_type);

  // Model names, in the model's order.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_buffers() const;
  // Parameters and buffers by model name, detached: what torch.save keeps.
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Copies `state`'s tensors (by model name, of the pipeline's shapes) into
  // the pipeline; returns the names it lacks and those it has no place for.
  // `strict`: any of either is an error naming the first, and nothing is
  // copied; otherwise the names present are loaded.
  struct IncompatibleKeys {
    std::vector<std::string> missing, unexpected;
  };
  IncompatibleKeys load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict = true);

  // This process's runtime (across processes, its worker's stages).
  Pipeline& pipeline() { return *pipe_; }
  const Pipeline& pipeline() const { return *pipe_; }
  // Null unless built with process groups.
  DistributedPipeline* distributed() { return distributed_.get(); }
  // The plan's text; with balance "time", its predicted times and memory.
  // With plan "auto", the search: the chosen plan and the runners-up.
  std::string plan_text() const {
    return !search_text_.empty() ? search_text_ : plan_ ? plan_->str() : pipe_->plan().str();
  }
  // The plan's prediction, made with balance "time" (a profile).
  const std::optional<Plan>& prediction() const { return plan_; }
  const std::string& fused_ops_report() const { return fused_ops_report_; }
  // The options it was built with: the pipeline's are pipeline().options().
  const BuildOptions& build_options() const { return build_; }
  const DistributedOptions& distributed_options() const { return distributed_options_; }

 private:
  void build(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
             std::shared_ptr<ProcessGroups> groups, ValueText text);

  torch::jit::Module model_;
  BuildOptions build_;
  DistributedOptions distributed_options_;
  std::string fused_ops_report_ = "fused_ops is off\n";
  std::optional<Plan> plan_;
  std::string search_text_;
  std::unique_ptr<Pipeline> local_;                   // in one process
  std::unique_ptr<DistributedPipeline> distributed_;  // across processes
  Pipeline* pipe_ = nullptr;                          // the one of them
  StepResult last_;
  TensorsLossFn loss_;
};

}  // namespace conveyor
