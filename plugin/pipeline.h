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
#include "plugin/builder/request.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/core/options.h"
#include "plugin/core/step_result.h"
#include "plugin/distributed/process_groups.h"
#include "plugin/model/stage_split.h"
#include "plugin/planner/planner.h"
#include "schedules/schedule.h"

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

class StageRunner;        // plugin/runner/stage_runner.h
class DistributedRunner;  // plugin/distributed/distributed_runner.h

class Pipeline {
 public:
  // Checks the options (check_request), then builds. With `groups`, this
  // process runs its worker's stages of replica groups->replica(); every
  // process passes the same model and options.
  explicit Pipeline(const Model& model, PipelineOptions options = {}, std::shared_ptr<ProcessGroups> groups = nullptr);
  // With a loss, a sample to profile or a batch size besides the options:
  // Pipeline(model, {.options = ..., .loss = ...}).
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
  // global batch's. Braced lists are lists of tensors: train_step({x}, {y}).
  const StepResult& train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss);
  const StepResult& train_step(const at::Tensor& input, const at::Tensor& target);
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss);
  const StepResult& train_step(const Tensors& inputs, const Tensors& targets);
  const StepResult& train_step(std::initializer_list<at::Tensor> inputs, std::initializer_list<at::Tensor> targets,
                               const TensorsLossFn& loss);
  const StepResult& train_step(std::initializer_list<at::Tensor> inputs, std::initializer_list<at::Tensor> targets);
  // One step on micro-batches the caller made (bucketing: each padded to its
  // own length): exactly options().microbatches() of them.
  const StepResult& train_microbatches(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets,
                                       const TensorsLossFn& loss);
  const StepResult& last_step() const { return last_; }
  // Inference: no autograd, nothing stashed. Across processes the output is
  // on the last stage's process, an undefined tensor (an empty list)
  // elsewhere. forward({x, mask}) returns the list of outputs.
  at::Tensor forward(const at::Tensor& input);
  Tensors forward(const Tensors& inputs);
  Tensors forward(std::initializer_list<at::Tensor> inputs);
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
  // what torch.save keeps. With shard "parameters", after unshard() (the
  // weights are otherwise each replica's pieces: an error says so).
  std::vector<std::pair<std::string, at::Tensor>> state_dict() const;
  // Copies `state`'s tensors (by model name, of the pipeline's shapes) into
  // the pipeline; returns the names it lacks and those it has no place for.
  // `strict`: any of either is an error naming the first, and nothing is
  // copied; otherwise the names present are loaded. With shard "parameters",
  // after unshard(); the loaded weights become each replica's pieces.
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
  // Which layers each stage runs, and on which device.
  const StageSplit& split() const;
  // The options as given, with the plan's choices (plan "auto": the cut it
  // chose, as boundaries): what builds the same pipeline again.
  const PipelineOptions& options() const { return options_; }
  // Steps train_step has completed.
  int64_t completed_steps() const;
  // The plan's text; with balance "time", its predicted times and memory.
  // With plan "auto", the search: the chosen plan and the runners-up.
  std::string plan_text() const;
  // The step the plan predicts, made with balance "time" (a profile).
  const std::optional<Prediction>& prediction() const { return prediction_; }
  const std::string& fused_ops_report() const { return fused_ops_report_; }
  // Bytes of the state of this process's stages' own optimizers (sharded:
  // this replica's part).
  int64_t optimizer_state_bytes() const;

  // Across processes: global rank 0 logs, checkpoints and evaluates (in one
  // process, true); `base` times the replicas with scale_learning_rate.
  bool is_logging_rank() const;
  double learning_rate(double base) const;

  // This process's stages and their runtime (across processes, its
  // worker's), which checkpoints and timelines read
  // (plugin/runner/stage_runner.h).
  StageRunner& runner();
  const StageRunner& runner() const;
  // Across processes, this process's part of the job: its process groups,
  // gather_model() to the logging rank (plugin/distributed/distributed_runner.h);
  // null in one process.
  DistributedRunner* distributed() { return distributed_.get(); }
  const DistributedRunner* distributed() const { return distributed_.get(); }

 private:
  // `request` checked for its groups' processes (none: one process) and `model`'s kind.
  static CheckedRequest check(BuildRequest request, const Model& model);

  PipelineOptions options_;
  std::string fused_ops_report_ = "fused_ops is off\n";
  // state_dict() with the later stages' copies of tied weights too.
  std::vector<std::pair<std::string, at::Tensor>> state_entries() const;

  std::vector<std::pair<std::string, std::string>> aliases_;  // see ModelLayers
  std::vector<std::string> transient_buffers_;
  std::optional<Prediction> prediction_;
  std::string search_text_;
  std::unique_ptr<StageRunner> local_;              // in one process
  std::unique_ptr<DistributedRunner> distributed_;  // across processes
  StepResult last_;
  TensorsLossFn loss_;
};

// Checkpoints of a pipeline (plugin/checkpoint/checkpoint.h says what they
// hold): each process saves and loads its own stages.
void save_checkpoint(const std::string& path, const Pipeline& pipe, const TrainingState& state = {});
int64_t load_checkpoint(const std::string& path, Pipeline& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers = {});
// Every rank's files of one step, merged and resharded to this pipeline's
// stages and replicas (plugin/checkpoint/checkpoint.h).
int64_t load_checkpoint_files(const std::vector<std::string>& paths, Pipeline& pipe,
                              const std::vector<torch::optim::Optimizer*>& optimizers = {});
// The plain state dict ({name: tensor}, pipe.state_dict()'s keys), which
// torch.load reads and the unsplit model loads; in one process.
void save_model_state(const std::string& path, const Pipeline& pipe);

}  // namespace conveyor
