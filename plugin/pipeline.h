#pragma once
// Pipeline: the user-facing API. Splits a torch::nn::Sequential into stages,
// places them on devices and trains or evaluates it under a schedule.
//
//   conveyor::Pipeline pipe(model, conveyor::PipelineOptions()
//                                      .stages(2).microbatches(8).schedule("1f1b"));
//   torch::optim::SGD opt(pipe.parameters(), 0.1);
//   opt.zero_grad();
//   auto r = pipe.train_step(input, target, [](auto& out, auto& tgt) {
//     return torch::nn::functional::cross_entropy(out, tgt); });
//   opt.step();
//
// train_step accumulates into .grad exactly as loss.backward() on the unsplit
// model would (the caller zeroes gradients, as with any torch::optim
// optimizer). If a step fails, .grad may hold part of that step's gradient.

#include "plugin/options.h"
#include "plugin/partition.h"
#include "plugin/runtime.h"
#include "plugin/step_result.h"
#include "schedules/schedule.h"

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class Pipeline {
 public:
  // Takes the model's layers (shared, not copied) and moves each to its
  // stage's device. Throws std::invalid_argument for a bad configuration,
  // before anything is moved.
  explicit Pipeline(torch::nn::Sequential model, PipelineOptions options = {});

  // One training step on a whole batch: splits it into micro-batches, runs
  // the schedule, accumulates gradients. Returns the batch's loss and timings.
  StepResult train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);

  // Inference: no autograd, nothing stashed; micro-batches flow through the
  // stages concurrently. Output on the last stage's device.
  at::Tensor forward(const at::Tensor& input);

  std::vector<at::Tensor> parameters() const;
  // Names as in the original Sequential ("3.weight").
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;

  // Training or evaluation mode of every layer (dropout, batch norm).
  void train(bool on = true);
  void eval() { train(false); }

  int num_stages() const { return runtime_->num_stages(); }
  const Stage& stage(int k) const { return runtime_->stage(k); }
  const StagePlan& plan() const { return plan_; }
  const schedules::Schedule& schedule() const { return schedule_; }
  const PipelineOptions& options() const { return options_; }

 private:
  std::vector<at::Tensor> split(const at::Tensor& batch, const char* what, int num_microbatches) const;

  PipelineOptions options_;
  StagePlan plan_;
  schedules::Schedule schedule_;
  std::unique_ptr<Runtime> runtime_;
};

}  // namespace conveyor
