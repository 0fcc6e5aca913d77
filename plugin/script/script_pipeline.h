#pragma once
// ScriptPipeline: a pipeline over a TorchScript model configured by a dict of
// options, as Python hands them over. Both ways in from Python build on it:
// the `conveyor` package's extension module (python/src/module.cpp), which
// adds Python callables for the loss and the learning rate, and the
// TorchScript class torch.classes.conveyor.Pipeline (python_class.cpp).
//
// Options (values of the documented types; numbers may also arrive as
// strings from the TorchScript class's untyped dict):
//   workers, microbatches, schedule, schedule_text, devices (list or
//   comma-separated), split_points (list or comma-separated), balance
//   ("uniform" | "parameters" | "time"), batch_dim, channel_capacity,
//   timeout_ms, optimize (let the TorchScript executor optimize), loss
//   ("cross_entropy" over the last dimension | "mse" | a scripted module
//   called as loss(*outputs, *targets)), loss_reduction ("mean" | "sum"),
//   fused_ops (swap_fused_ops on the model first), stage_rng, chunks,
//   lookahead (eager-1f1b's forwards ahead per later stage),
//   recompute, offload, vertical_sync, trace, divergence_guard, sample (an
//   (input, target) batch whose first micro-batch is profiled: needed by
//   balance "time", which splits by measured time and predicts the step),
//   optimizer ("sgd" | "adam" | "adamw": the pipeline's own, one per stage)
//   with lr (required), momentum (sgd) and weight_decay, shared_inputs and
//   shared_targets, tied_parameters (lists of parameter names),
//   lr_schedule_unit ("batch" | "microbatch"), autocast ("bf16" | "fp16"),
//   loss_scaling (True, or a dict of init_scale, growth_factor,
//   backoff_factor, growth_interval), clip_grad_norm, clip_norm_type (a
//   number or "inf"), accumulate_steps. PipelineOptions documents each.
//   plan: "auto" searches the whole plan (plugin/planner/search.h: workers,
//   schedule, chunks, micro-batches, recomputation and the split) on the
//   profile of `sample`, within max_workers (default: workers, else 4) and
//   memory_budget (bytes per worker; default none); the other options
//   stand. "tuned" then times the plans predicted fastest on `sample` with
//   the loss (plugin/tune_plan.h) and takes the fastest measured.
// Every error in the options is a std::invalid_argument naming the option.
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
  ScriptPipeline(const c10::IValue& model, const ScriptOptions& options, const Customize& customize = nullptr,
                 std::shared_ptr<ProcessGroups> groups = nullptr, DistributedOptions distributed = {});

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
  // Copies `state` (every parameter and buffer, by model name, of the same
  // shapes; nothing missing, nothing unexpected) into the pipeline.
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state);

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

 private:
  void build(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
             std::shared_ptr<ProcessGroups> groups, DistributedOptions distributed);

  torch::jit::Module model_;
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
