#pragma once
// The one way from a model to a running pipeline. Everything that builds a
// pipeline from a model builds it here: C++ code, the conveyor Python
// package (python/src/module.cpp), the TorchScript class
// torch.classes.conveyor.Pipeline (torch_class.cpp), the examples and the
// benchmarks. Its phases, top to bottom, each a file of this folder:
//   1. front_end.h  the model as layers: torch::nn layers as they are, a
//                   TorchScript module (fused ops swapped in first, when
//                   asked) or a torch.export program cut at the split points;
//   2. plan.h       the plan: the options' own, searched or raced, with the
//                   sample's first micro-batch profiled once when it needs it;
//   3. builder.cpp  the runtime: a Pipeline in this process, or a
//                   DistributedPipeline over torch.distributed's groups (one
//                   worker per process; parameters and state are then this
//                   process's stages').
//
//   conveyor::BuiltPipeline pipe(conveyor::load_script("lm.pt"),
//                                {.pipeline = conveyor::PipelineOptions().microbatches(4),
//                                 .build = conveyor::BuildOptions().split_points({"encoder", "decoder"}),
//                                 .loss = loss});
//   pipe.train_step({x}, {y});
//
// Options: PipelineOptions, BuildOptions and DistributedOptions, whose rows
// are all in plugin/option_list.h; dict_options.h reads them from a
// dict as Python gives them. Every error in them is a std::invalid_argument
// naming the option.

#include "plugin/distributed/distributed_pipeline.h"
#include "plugin/options.h"
#include "plugin/pipeline.h"
#include "plugin/builder/build_options.h"
#include "plugin/builder/front_end.h"
#include "plugin/builder/plan.h"
#include "plugin/planner/planner.h"
#include "plugin/step_result.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

// What a pipeline is built with, besides the model.
struct BuildRequest {
  PipelineOptions pipeline;
  BuildOptions build;
  DistributedOptions distributed;
  // The loss train_step takes (and the profile and plan "tuned" run):
  // loss(outputs, targets) -> a scalar.
  TensorsLossFn loss;
  // A whole batch: its first micro-batch is profiled when balance "time" or
  // plan "auto" needs it, and the plan then predicts the step.
  std::optional<SampleBatch> sample;
  // torch.distributed's groups (the conveyor package hands them over): each
  // process builds the same pipeline and runs its worker's stages.
  std::shared_ptr<ProcessGroups> groups;
};

// The checks of a request that need no model: each option's bounds, a
// known schedule, the pipeline's optimizer given once and whole, what the
// plan mode needs (check_plan), workers that fit the split points.
// `processes`: the pipeline's processes (its group's size), 0 in one
// process. Throws std::invalid_argument naming the option.
void check_request(const BuildRequest& request, int processes);

// A request that has passed check_request for `processes` processes, which
// BuiltPipeline builds without checking again. The conveyor package checks
// at construction and builds later (an nn.Module is exported from the first
// step's inputs), attaching then what was only promised when checked.
class CheckedRequest {
 public:
  // Checks the request; throws std::invalid_argument naming the option.
  CheckedRequest(BuildRequest request, int processes);
  const BuildRequest& request() const { return request_; }
  int processes() const { return processes_; }
  // The loss itself, where the check knew only that there is one.
  void attach_loss(TensorsLossFn loss);
  void attach_lr_schedule(LearningRateSchedule schedule);
  // The groups of the `processes` processes the request was checked for.
  void attach_groups(std::shared_ptr<ProcessGroups> groups);

 private:
  friend class BuiltPipeline;
  BuildRequest request_;
  int processes_ = 0;
};

class BuiltPipeline {
 public:
  // Checks `request` (check_request), then builds.
  BuiltPipeline(const Model& model, BuildRequest request);
  // Builds a request checked before.
  BuiltPipeline(const Model& model, CheckedRequest request);

  // One step; gradients accumulate into parameters()' .grad (or the
  // pipeline's optimizer steps). The result is also kept as last_step().
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets);
  const StepResult& last_step() const { return last_; }
  // Inference; across processes the output is on the last stage's process,
  // an empty list elsewhere.
  Tensors forward(const Tensors& inputs);
  // Clips the gradients' global norm (across processes too); returns it.
  double clip_grad_norm(double max_norm, double norm_type);

  // Model names, in the model's order, each once: a tied weight by its
  // first name and its first holder's tensor (the one a caller's optimizer
  // steps; the pipeline keeps the later stages' copies equal to it).
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  std::vector<at::Tensor> parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_buffers() const;
  // Parameters and persistent buffers by model name, detached, as the
  // model's state_dict() has them (a tied weight under each of its names):
  // what torch.save keeps.
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
  Model model_;
  BuildOptions build_;
  DistributedOptions distributed_options_;
  std::string fused_ops_report_ = "fused_ops is off\n";
  // state_dict() with the later stages' copies of tied weights too.
  std::vector<std::pair<std::string, at::Tensor>> state_entries() const;

  std::vector<std::pair<std::string, std::string>> aliases_;  // see ModelLayers
  std::vector<std::string> transient_buffers_;
  std::optional<Plan> plan_;
  std::string search_text_;
  std::unique_ptr<Pipeline> local_;                   // in one process
  std::unique_ptr<DistributedPipeline> distributed_;  // across processes
  Pipeline* pipe_ = nullptr;                          // the one of them
  StepResult last_;
  TensorsLossFn loss_;
};

}  // namespace conveyor
