#pragma once
// What conveyor::Pipeline (plugin/pipeline.h) is built with besides the
// model, and its checks: a BuildRequest, checked once (check_request) into a
// CheckedRequest, which the build takes without checking again.

#include "plugin/builder/front_end.h"
#include "plugin/builder/plan.h"
#include "plugin/core/options.h"
#include "plugin/core/types.h"
#include "plugin/distributed/process_groups.h"

#include <cstdint>
#include <memory>
#include <optional>

namespace conveyor {

// What a pipeline is built with, besides the model.
struct BuildRequest {
  PipelineOptions options;
  // The loss train_step takes when it is given none (and that the profile
  // and plan "tuned" run): loss(outputs, targets) -> a scalar.
  TensorsLossFn loss;
  // A whole batch: its first micro-batch is profiled when balance "time" or
  // plan "auto" needs it, and the plan then predicts the step.
  std::optional<SampleBatch> sample;
  // torch.distributed's groups (conveyor::ProcessGroups; the conveyor
  // package hands them over): each process builds the same pipeline and
  // runs its worker's stages.
  std::shared_ptr<ProcessGroups> groups;
  // Plan "auto" on a profile of the caller's own (the option profile, where
  // no sample can be split as a step splits it): the step's batch size.
  int64_t batch_size = 0;
};

// Every check of a request that needs no more of the model than its kind:
// each option's value alone (check_option_values), a known schedule, the pipeline's optimizer given
// whole, what the plan mode needs (check_plan_mode), workers that fit the
// split points, the options across processes only with processes, and,
// where `kind` is known, what a model of that kind can take
// (check_model_kind). The build checks none of these again.
// `processes`: the pipeline's processes (its group's size), 0 in one
// process. `kind`: the model's (none for a file, which the build reads and
// checks then). Throws std::invalid_argument naming the option.
void check_request(const BuildRequest& request, int processes, std::optional<ModelKind> kind);

// A request that has passed check_request for `processes` processes, which
// Pipeline builds without checking again. The conveyor package checks
// at construction and builds later (an nn.Module is exported from the first
// step's inputs), attaching then what was only promised when checked.
class CheckedRequest {
 public:
  // Checks the request for a model of `kind` (none: a file's, not read
  // yet); throws std::invalid_argument naming the option.
  CheckedRequest(BuildRequest request, int processes, std::optional<ModelKind> kind);
  const BuildRequest& request() const { return request_; }
  int processes() const { return processes_; }
  // The model kind the options were checked for (none: not checked).
  std::optional<ModelKind> model_kind() const { return kind_; }
  // The loss itself, where the check knew only that there is one.
  void attach_loss(TensorsLossFn loss);
  void attach_lr_schedule(LearningRateSchedule schedule);
  // The groups of the `processes` processes the request was checked for.
  void attach_groups(std::shared_ptr<ProcessGroups> groups);

 private:
  friend class Pipeline;
  BuildRequest request_;
  int processes_ = 0;
  std::optional<ModelKind> kind_;
};

}  // namespace conveyor
