#pragma once
// Runtime: executes a Schedule over stages and a transport. It knows nothing of
// which method produced the schedule: every stage thread walks its own action
// list, and forward/backward are the only things it knows how to do.

#include "plugin/stage.h"
#include "plugin/step_result.h"
#include "plugin/transport.h"
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
  std::vector<at::Tensor> inputs;    // per micro-batch, fed to stage 0
  std::vector<at::Tensor> targets;   // per micro-batch, given to loss_fn on the last stage
  std::vector<double> loss_weights;  // per micro-batch, multiplies its loss
  const LossFn* loss_fn = nullptr;   // null: inference (no autograd, nothing stashed)
};

class Runtime {
 public:
  Runtime(std::vector<std::shared_ptr<Stage>> stages, std::unique_ptr<Transport> transport, bool trace);

  // Runs `schedule` once. On inference, `outputs` (if given) receives the last
  // stage's output per micro-batch. Throws PipelineError naming the stage,
  // micro-batch and action of the first failure; the other stages stop.
  StepResult run(const schedules::Schedule& schedule, const StepData& data,
                 std::vector<at::Tensor>* outputs = nullptr);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  const Stage& stage(int k) const { return *stages_.at(k); }

 private:
  struct StepContext;
  void run_stage(int k, const schedules::Schedule& schedule, const StepData& data, StepContext& ctx);
  void forward(int k, int mb, const StepData& data, StepContext& ctx);
  void backward(int k, int mb, StepContext& ctx);

  std::vector<std::shared_ptr<Stage>> stages_;
  std::unique_ptr<Transport> transport_;
  std::vector<std::optional<c10::Stream>> streams_;  // per stage, on accelerators
  bool trace_;
  StageWorkers workers_;
};

}  // namespace conveyor
