#pragma once
// PipelineOptions: everything a Pipeline is configured with, set
// builder-style: PipelineOptions().workers(4).microbatches(8). Each option is
// one row of plugin/core/option_list.h, which documents it; here they are grouped
// by section (what to cut, the schedule, batching, training, running, the
// plan, the model, across processes), and the runtime takes its sections as
// they are.
//
// Words: a *stage* is a piece of the model (a run of layers); a *worker* is
// the thread, or process, that runs one or more stages on its device
// (torch.distributed.pipelining says rank). With one chunk per worker,
// worker k runs stage k.

#include "plugin/core/option_list.h"

#include <type_traits>
#include <utility>

namespace conveyor {

#define CONVEYOR_SECTION_ACCESSORS(section, Type, name, default_, bound, doc) \
  PipelineOptions& name(const Type& value) {                                  \
    section##_.name = value;                                                  \
    return *this;                                                             \
  }                                                                           \
  PipelineOptions& name(Type&& value) {                                       \
    section##_.name = std::move(value);                                       \
    return *this;                                                             \
  }                                                                           \
  const Type& name() const noexcept { return section##_.name; }               \
  Type& name() noexcept { return section##_.name; }

struct PipelineOptions {
 public:
  CONVEYOR_PIPELINE_OPTIONS(CONVEYOR_SECTION_ACCESSORS)

  // The sections, each a plain struct of its rows' values.
  const CuttingOptions& cutting() const { return cutting_; }
  const SchedulingOptions& scheduling() const { return scheduling_; }
  const BatchingOptions& batching() const { return batching_; }
  const TrainingOptions& training() const { return training_; }
  const RunningOptions& running() const { return running_; }
  const PlanningOptions& planning() const { return planning_; }
  const ModelOptions& model() const { return model_; }
  const DistributedOptions& distributed() const { return distributed_; }
  // A whole section at once.
  PipelineOptions& distributed(DistributedOptions section) {
    distributed_ = std::move(section);
    return *this;
  }

 private:
  CuttingOptions cutting_;
  SchedulingOptions scheduling_;
  BatchingOptions batching_;
  TrainingOptions training_;
  RunningOptions running_;
  PlanningOptions planning_;
  ModelOptions model_;
  DistributedOptions distributed_;
};

// The factory the option `optimizer` gives (null without one): its own, or
// torch.optim's optimizer of that name with lr, momentum and weight_decay.
// std::invalid_argument for lr, momentum or weight_decay without a name,
// a name without lr, or momentum for an optimizer that has none.
OptimizerFactory optimizer_factory(const PipelineOptions& options);
// Sets the option `optimizer` to `factory` (a wrapper of the one it gave,
// say), clearing lr, momentum and weight_decay, which only a name takes.
void set_optimizer_factory(PipelineOptions& options, OptimizerFactory factory);

#undef CONVEYOR_SECTION_ACCESSORS

CONVEYOR_FOR_EACH_OPTION(PipelineOptions, CONVEYOR_PIPELINE_OPTIONS)

// What can be checked of each option's value alone: every row within its
// bound. Throws
// std::invalid_argument naming the option. check_request
// (plugin/builder/request.h) runs it for conveyor::Pipeline, once; a
// StageRunner or DistributedRunner built directly runs it itself.
void check_option_values(const PipelineOptions& options);

// Passed to a runner's constructor by a caller whose options have passed
// check_option_values already (conveyor::Pipeline's): not checked again.
struct OptionValuesChecked {};

}  // namespace conveyor
