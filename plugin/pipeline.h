#pragma once
// conveyor::Pipeline: the one class a user builds. It takes any model (a
// torch::nn::Sequential, a TorchScript module, a torch.export program, or the
// path of a saved one), cuts it into stages and trains it under a schedule, in
// this process (a thread per worker, each on its device) or across the
// processes of torch.distributed's groups (one worker a process, with
// data-parallel replicas).
//
//   torch::nn::Sequential model(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
//   conveyor::Pipeline pipe(model, conveyor::PipelineOptions().workers(2).microbatches(4).schedule("1f1b"));
//   torch::optim::Adam opt(pipe.parameters(), 1e-2);
//   auto r = pipe.train_step(x, y, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); });
//   opt.step();
//   opt.zero_grad();
//
//   conveyor::Pipeline lm(conveyor::load_script("lm.pt"),
//                         conveyor::PipelineOptions().split_points({"encoder", "decoder"}).microbatches(4)
//                             .optimizer(conveyor::OptimizerName::kAdamW).lr(1e-3));
//
// With a synchronous schedule, train_step accumulates into .grad exactly as
// loss.backward() on the unsplit model would (the caller zeroes gradients and
// steps, as with any torch::optim optimizer; or gives the pipeline its own
// optimizer, and train_step steps it). With an asynchronous schedule
// (pipedream, ddg, fr) the pipeline owns one optimizer per stage and every
// micro-batch is a mini-batch with its own update on every stage.
//
// Building runs in phases, each a file of plugin/builder/: the model as
// layers (front_end.h), the plan (plan.h: the options' own, searched or
// raced, with a sample's first micro-batch profiled once when it needs it),
// then the runner: a StageRunner (plugin/runner/stage_runner.h) in this
// process, or a DistributedRunner (plugin/distributed/distributed_runner.h)
// over the groups. Every option is a row of plugin/core/option_list.h; an
// error in one is a std::invalid_argument naming it.

#include "plugin/builder/front_end.h"
#include "plugin/builder/plan.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/core/options.h"
#include "plugin/core/step_result.h"
#include "plugin/distributed/distributed_runner.h"
#include "plugin/planner/planner.h"
#include "plugin/runner/stage_runner.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
};

// The checks of a request that need no model: each option's bounds, a
// known schedule, the pipeline's optimizer given once and whole, what the
// plan mode needs (check_plan_mode), workers that fit the split points.
// `processes`: the pipeline's processes (its group's size), 0 in one
// process. Throws std::invalid_argument naming the option.
void check_request(const BuildRequest& request, int processes);

// A request that has passed check_request for `processes` processes, which
// Pipeline builds without checking again. The conveyor package checks
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
  friend class Pipeline;
  BuildRequest request_;
  int processes_ = 0;
};

class Pipeline {
 public:
  // Checks the options (check_request), then builds. With `groups`, this
  // process runs its worker's stages of replica groups->replica(); every
  // process passes the same model and options.
  explicit Pipeline(const Model& model, PipelineOptions options = {}, std::shared_ptr<ProcessGroups> groups = nullptr);
  Pipeline(const Model& model, BuildRequest request);
  // Builds a request checked before.
  Pipeline(const Model& model, CheckedRequest request);
  ~Pipeline();
  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;

  // One step on a whole batch (across processes, this replica's: see
  // shard()): split into micro-batches, run under the schedule, gradients
  // accumulated into parameters()' .grad (or the pipeline's optimizer
  // stepped). Stage 0 reads the inputs, the loss the last stage's outputs
  // and the targets; without a loss here, the request's. The result is
  // last_step(), valid until the next step; across processes its loss is the
  // global batch's.
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets);
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss);
  const StepResult& train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);
  // One step on micro-batches the caller made (bucketing: each padded to its
  // own length): exactly options().microbatches() of them.
  const StepResult& train_microbatches(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets,
                                       const TensorsLossFn& loss);
  const StepResult& last_step() const { return last_; }
  // Inference: no autograd, nothing stashed. Across processes the output is
  // on the last stage's process, an empty list (an undefined tensor) elsewhere.
  Tensors forward(const Tensors& inputs);
  at::Tensor forward(const at::Tensor& input);
  // Clips the gradients' global norm, as clip_grad_norm_ on the unsplit
  // model (across processes too), for a caller that owns its optimizer;
  // returns the norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // Model names, in the model's order, each once: a tied weight by its
  // first name and its first holder's tensor (the one a caller's optimizer
  // steps; the pipeline keeps the later stages' copies equal to it). Across
  // processes, this process's stages'.
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

  // Training or evaluation mode of every layer (dropout, batch norm).
  void train(bool on = true);
  void eval() { train(false); }

  // Pieces of the model (the schedule's stages) and the workers that run them.
  int num_stages() const;
  int num_workers() const;
  const schedules::Schedule& schedule() const;
  // The options as built: the given ones with the plan's choices (the
  // runner's, runner().options(), are this process's: its device, its
  // optimizer as a factory).
  const PipelineOptions& options() const;
  // Steps train_step has completed.
  int64_t completed_steps() const;
  // The plan's text; with balance "time", its predicted times and memory.
  // With plan "auto", the search: the chosen plan and the runners-up.
  std::string plan_text() const;
  // The plan's prediction, made with balance "time" (a profile).
  const std::optional<Prediction>& prediction() const { return plan_; }
  const std::string& fused_ops_report() const { return fused_ops_report_; }

  // Across processes: global rank 0 logs, checkpoints and evaluates (in one
  // process, true); `base` times the replicas with scale_learning_rate.
  bool is_logging_rank() const;
  double learning_rate(double base) const;

  // This process's stages and their runtime (across processes, its
  // worker's): what checkpoints, timelines and per-stage inspection read.
  StageRunner& runner() { return *runner_; }
  const StageRunner& runner() const { return *runner_; }
  // Null unless built with process groups.
  DistributedRunner* distributed() { return distributed_.get(); }
  const DistributedRunner* distributed() const { return distributed_.get(); }

 private:
  PipelineOptions options_;
  std::string fused_ops_report_ = "fused_ops is off\n";
  // state_dict() with the later stages' copies of tied weights too.
  std::vector<std::pair<std::string, at::Tensor>> state_entries() const;

  std::vector<std::pair<std::string, std::string>> aliases_;  // see ModelLayers
  std::vector<std::string> transient_buffers_;
  std::optional<Prediction> plan_;
  std::string search_text_;
  std::unique_ptr<StageRunner> local_;              // in one process
  std::unique_ptr<DistributedRunner> distributed_;  // across processes
  StageRunner* runner_ = nullptr;                   // the one of them
  StepResult last_;
  TensorsLossFn loss_;
};

// Checkpoints of a pipeline (plugin/checkpoint/checkpoint.h says what they
// hold): each process saves and loads its own stages.
void save_checkpoint(const std::string& path, const Pipeline& pipe, const TrainingState& state = {});
int64_t load_checkpoint(const std::string& path, Pipeline& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers = {});
// The plain state dict ({name: tensor}, pipe.state_dict()'s keys), which
// torch.load reads and the unsplit model loads; in one process.
void save_model_state(const std::string& path, const Pipeline& pipe);

}  // namespace conveyor
