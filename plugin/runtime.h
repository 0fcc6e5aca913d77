#pragma once
// Runtime: executes a Schedule over stages and a transport. It knows nothing of
// which method produced the schedule: every stage thread walks its own action
// list, and does what the schedule declares around each action (stash the
// graph or only the input, read the live or a stashed weight version, step
// the stage's optimizer after a backward, meet lock-step barriers).

#include "plugin/activation_stash.h"
#include "plugin/stage.h"
#include "plugin/step_result.h"
#include "plugin/transport/transport.h"
#include "plugin/workers.h"
#include "schedules/schedule.h"

#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace conveyor {

// Returns the loss of one micro-batch: a scalar (see LossReduction).
using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

struct StepData {
  std::vector<at::Tensor> inputs;     // per micro-batch, fed to stage 0
  std::vector<at::Tensor> targets;    // per micro-batch, given to loss_fn on the last stage
  std::vector<double> loss_scale;     // per micro-batch, multiplies its loss before its backward
  std::vector<double> report_weight;  // per micro-batch, its share of the step's reported loss
  const LossFn* loss_fn = nullptr;    // null: inference (no autograd, nothing stashed)
};

struct RuntimeOptions {
  bool trace = true;
  bool divergence_guard = true;
  // Learning rate of a stage's n-th update; null leaves the optimizer's own.
  std::function<double(int64_t)> learning_rate;
};

class Runtime {
 public:
  // `stages[k]` may be null for a stage that runs in another process (the
  // transport reaches it); this process runs the others, one thread each.
  Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport, RuntimeOptions options);

  // Runs `schedule` once. On inference, `outputs` (if given) receives the last
  // stage's output per micro-batch. Throws PipelineError naming the stage,
  // micro-batch and action of the first failure (DivergenceError for a
  // non-finite loss or gradient); the other stages stop.
  StepResult run(const schedules::Schedule& schedule, const StepData& data, std::vector<at::Tensor>* outputs = nullptr);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  bool is_local(int k) const { return stages_.at(k) != nullptr; }
  const Stage& stage(int k) const { return *stages_.at(k); }
  Stage& stage(int k) { return *stages_.at(k); }
  // Training steps completed (run() calls with a loss that succeeded).
  int64_t completed_steps() const { return completed_steps_; }
  void restore_completed_steps(int64_t steps) { completed_steps_ = steps; }

 private:
  struct StepContext;
  void run_stage(int k, const schedules::Schedule& schedule, const StepData& data, StepContext& ctx);
  void forward(int k, int mb, const schedules::Schedule& schedule, const StepData& data, StepContext& ctx);
  void backward(int k, int mb, const schedules::Schedule& schedule, const StepData& data, StepContext& ctx);
  // The optimizer step after a backward (schedules that step per micro-batch).
  void optimizer_step(int k, int mb, const schedules::Schedule& schedule, StepContext& ctx);
  // The last stage's loss of micro-batch mb (a scalar; checked).
  at::Tensor loss_of(int mb, const at::Tensor& output, const StepData& data) const;
  // An inputs-only stash entry's backward root: its forward again, with grad.
  at::Tensor replay_forward(int k, int mb, StashEntry& entry, const StepData& data);
  void check_finite(int k, int mb, const char* what, const std::vector<at::Tensor>& tensors,
                    const schedules::Schedule& schedule, const std::string& action) const;

  std::vector<std::shared_ptr<Stage>> stages_;
  std::vector<int> local_;  // indices of the stages this process runs
  std::unique_ptr<Transport> transport_;
  std::vector<std::optional<c10::Stream>> streams_;  // per stage, on accelerators
  RuntimeOptions options_;
  StageWorkers workers_;
  int64_t completed_steps_ = 0;
};

}  // namespace conveyor
