#pragma once
// The planner, in three words. A *split* (StageSplit) says which layers
// each stage runs and on which device; split_stages decides it from the
// options (a policy, or balance "time" on a profile). A *prediction*
// (Prediction) prices a split under a schedule and a number of
// micro-batches: per-stage time, the step's makespan and bubble (the
// simulator, schedules/simulate.h), and per-stage peak memory (weights,
// gradients, optimizer state, stashed weight versions, and the micro-batches
// the schedule keeps in flight); predict_step makes one. A *plan* (Plan,
// plugin/builder/plan.h) is the decided configuration a pipeline is built
// from, and decide_plan decides it: given by the options, searched
// (search_plans, plugin/planner/search.h) or raced (race_candidates,
// plugin/measure/race_candidates.h). A StepResult can be held against a
// prediction and drawn below it.
//
//   auto profile = std::make_shared<conveyor::ModelProfile>(conveyor::profile_model(model, x_mb, y_mb, loss));
//   auto options = conveyor::PipelineOptions().workers(2).microbatches(4).balance(conveyor::Balance::kTime)
//                      .profile(profile);
//   conveyor::Prediction predicted = conveyor::predict_step(model, options, batch_size);
//   std::cout << predicted.str();
//   conveyor::Pipeline pipe(model, options);
//   auto r = pipe.train_step(x, y, loss);
//   std::cout << predicted.versus(r);
//   predicted.write_timeline("step.svg", &r);

#include "plugin/core/options.h"
#include "plugin/planner/balance_time.h"
#include "plugin/planner/partition.h"
#include "plugin/planner/profile.h"
#include "plugin/core/step_result.h"
#include "schedules/schedule.h"
#include "schedules/simulate.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace conveyor {

struct StagePrediction {
  int64_t begin = 0, end = 0;  // layers [begin, end)
  // Per micro-batch of the step's mean size; the last stage's include the loss.
  double forward_seconds = 0, backward_seconds = 0;
  double transfer_seconds = 0;  // to the next stage (and the gradient back)
  int peak_inflight = 0;        // micro-batches held at once
  // An update of the stage's weights: a step of the pipeline's optimizer
  // (profiled with ProfileOptions::optimizer, else 0), the divergence guard's
  // check of the gradients, and under weight stashing the copy of the new
  // version: part of every backward under an asynchronous schedule, once
  // after the flush under a synchronous one.
  double update_seconds = 0;
  int64_t weight_bytes = 0;     // trainable weights and their gradients
  int64_t optimizer_bytes = 0;  // PipelineOptions::optimizer_state_per_weight of the weights
  int64_t weight_version_bytes = 0;  // stashed weight versions (schedules with weight stashing)
  // The stage's inputs and outputs held for in-flight micro-batches, as
  // StepResult::peak_stash_bytes counts them (exact).
  int64_t stash_bytes = 0;
  // An estimate of what autograd keeps inside the stage for them: the outputs
  // of its inner layers (a layer's own saved tensors may be larger).
  int64_t activation_bytes = 0;
  // Offloaded stashes (PipelineOptions::offload on an accelerator, the
  // profile's host_link measured): of stash_bytes, those waiting in host
  // memory at the peak, not on the device (it holds two entries at most: one
  // coming back for its backward, one in it or going out), and each entry's
  // copy, out or back, on the stage's side stream.
  int64_t offloaded_bytes = 0;
  double host_copy_seconds = 0;
  // The device's: what waits in host memory left out.
  int64_t peak_bytes() const {
    return weight_bytes + optimizer_bytes + weight_version_bytes + stash_bytes - offloaded_bytes + activation_bytes;
  }
};

// When a single layer decides how fast any split can go.
struct SpeedBound {
  int64_t layer = 0;
  std::string name;
  double seconds = 0;        // its forward and backward per micro-batch (with the loss, if last)
  double model_seconds = 0;  // the whole model's
  // The most any number of stages can gain over one device: model / layer.
  double best_speedup() const { return seconds > 0 ? model_seconds / seconds : 0.0; }
};

struct Prediction {
  StageSplit split;
  schedules::Schedule schedule;
  int64_t batch_size = 0;  // samples per step
  std::string balance;     // how the split was chosen ("time", "uniform", ...)
  std::vector<StagePrediction> predicted;
  // Per worker: the most its stages hold at once, weights and states
  // included (a worker of one stage: that stage's peak_bytes()).
  std::vector<int64_t> worker_bytes;
  schedules::StageCosts costs;       // what the simulation priced each action at
  schedules::Simulation simulation;  // the predicted step
  // Set when the slowest stage is (almost) one layer alone.
  std::optional<SpeedBound> bound;

  // Beyond the simulated actions: after the flush of a synchronous schedule,
  // the slowest stage's update_seconds; before an asynchronous step, the
  // copy of every stage's weights it keeps to roll back to.
  double update_seconds = 0;

  double step_seconds() const { return simulation.makespan + update_seconds; }
  double bubble_fraction() const { return simulation.bubble_fraction; }
  // The prediction: one line per stage, the predicted step, and the bound.
  std::string str() const;
  // Predicted against measured: step time, bubble, busy time and peak stash per stage.
  std::string versus(const StepResult& measured) const;
  // The predicted step drawn above `measured` (when given): an SVG.
  void write_timeline(const std::string& path, const StepResult* measured = nullptr) const;
};

// The predictions for a given split (any policy) under `schedule` with a batch of `batch_size` samples.
Prediction predict_step(const ModelProfile& profile, const StageSplit& stages, const schedules::Schedule& schedule,
             int64_t batch_size, const PipelineOptions& options);

// Splits the model as `options` say (split_stages; Balance::kTime uses
// options.profile()) and predicts. Throws std::invalid_argument without a
// profile, or when the profile does not describe the model.
Prediction predict_step(const torch::nn::Sequential& model, const PipelineOptions& options, int64_t batch_size);

// The costs Balance::kTime splits by: a stage's forward, backward and
// transfers per micro-batch of the profile's size, its memory under the
// options' schedule and micro-batch count.
SplitCosts split_costs(const ModelProfile& profile, const PipelineOptions& options, int num_stages);

}  // namespace conveyor
