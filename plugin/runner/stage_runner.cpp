#include "plugin/runner/stage_runner.h"

#include "plugin/core/errors.h"
#include "plugin/model/microbatches.h"
#include "plugin/model/model_names.h"
#include "plugin/model/stage.h"
#include "plugin/model/tied_parameters.h"
#include "plugin/planner/partition.h"
#include "plugin/runtime/runtime.h"
#include "plugin/transport/transport.h"
#include "schedules/generators.h"
#include "schedules/sharding.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>
#include <cmath>
#include <stdexcept>

namespace conveyor {

namespace {

// The optimizer and learning-rate options must fit how the schedule updates.
void check_optimizer_options(const PipelineOptions& options, const schedules::Schedule& schedule) {
  const std::string name = "'" + schedule.name + "'";
  if (!schedule.synchronous() && !options.optimizer()) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " steps the optimizer after every micro-batch on every stage, so the pipeline needs "
                                "its own: give the option optimizer (a name with lr, or a factory)");
  }
  if (options.lr_schedule() && !options.optimizer()) {
    throw std::invalid_argument(
        "conveyor: lr_schedule needs the pipeline's own optimizer (PipelineOptions::optimizer)");
  }
  if (!options.lr_schedule()) return;
  const UpdateUnit unit = options.lr_schedule_unit().value_or(schedule.synchronous() ? UpdateUnit::kBatch
                                                                                       : UpdateUnit::kMicrobatch);
  if (!schedule.synchronous() && unit != UpdateUnit::kMicrobatch) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " updates the weights after every micro-batch, but the learning-rate schedule counts "
                                "batches: give lr_schedule_unit(UpdateUnit::kMicrobatch) and a schedule over updates");
  }
  if (schedule.synchronous() && unit != UpdateUnit::kBatch) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " updates the weights once per batch, but the learning-rate schedule counts "
                                "micro-batches: give lr_schedule_unit(UpdateUnit::kBatch)");
  }
}

// Mixed precision, loss scaling, clipping and accumulation must fit the
// schedule and who owns the optimizer.
void check_training_options(const PipelineOptions& options, const schedules::Schedule& schedule) {
  const std::string name = "'" + schedule.name + "'";
  if (const auto dtype = options.autocast()) {
    check_argument(*dtype == at::kBFloat16 || *dtype == at::kHalf, "conveyor: autocast runs the forward in ",
                   "at::kBFloat16 or at::kHalf; ", c10::toString(*dtype), " is not a mixed-precision dtype");
  }
  if (options.loss_scaling()) {
    check_argument(options.optimizer() != nullptr, "conveyor: loss scaling needs the pipeline's own optimizer ",
                   "(PipelineOptions::optimizer): a step whose gradients overflow must skip the optimizer step, ",
                   "which the pipeline can do only for an optimizer it steps");
  }
  if (options.clip_grad_norm() != 0) {  // its bound: its row's
    check_argument(options.optimizer() != nullptr, "conveyor: clip_grad_norm clips before the pipeline's own ",
                   "optimizer steps, and the pipeline has none: with your own optimizer, call ",
                   "Pipeline::clip_grad_norm(max_norm) between train_step and your optimizer's step");
  }
  check_argument(options.clip_grad_value() == 0 || options.optimizer() != nullptr, "conveyor: clip_grad_value clips ",
                 "before the pipeline's own optimizer steps, and the pipeline has none: with your own optimizer, call ",
                 "torch::nn::utils::clip_grad_value_(pipeline.parameters(), value) before its step");
  if (options.accumulate_steps() > 1) {
    check_argument(schedule.synchronous(), "conveyor: schedule ", name, " updates the weights after every ",
                   "micro-batch, so it cannot accumulate over train_steps; accumulate_steps needs a synchronous ",
                   "schedule");
    check_argument(options.optimizer() != nullptr, "conveyor: accumulate_steps accumulates for the pipeline's own ",
                   "optimizer (PipelineOptions::optimizer); with your own, call train_step n times and step once");
  }
}

PipelineOptions values_checked(PipelineOptions options) {
  check_option_values(options);
  return options;
}

}  // namespace

StageRunner::StageRunner(torch::nn::Sequential model, PipelineOptions options)
    : StageRunner(std::move(model), values_checked(std::move(options)), OptionValuesChecked{}) {}

StageRunner::StageRunner(torch::nn::Sequential model, PipelineOptions options, OptionValuesChecked)
    : options_(std::move(options)), split_(split_stages(model, options_, &schedule_)) {
  build(model, -1, nullptr);
}

StageRunner::StageRunner(torch::nn::Sequential model, PipelineOptions options, int local_worker,
                   std::unique_ptr<Transport> transport, ReplicaReduction replicas)
    : options_(std::move(options)), split_(split_stages(model, options_, &schedule_)) {
  replicas_ = std::move(replicas);
  const schedules::Schedule& schedule = schedule_;
  check_argument(local_worker >= 0 && local_worker < schedule.num_workers(), "conveyor: local worker ", local_worker,
                 " is not a worker of this ", schedule.num_workers(), "-worker pipeline");
  if (!transport) throw std::invalid_argument("conveyor: a pipeline with one local worker needs a transport");
  if (schedule.has_virtual_stages() && !options_.tied_parameters().empty()) {
    throw std::invalid_argument(c10::str("conveyor: tied parameters across processes need one stage per process; ",
                                         "schedule '", schedule.name, "' runs ", schedule.num_stages, " chunks on ",
                                         schedule.num_workers(), " workers"));
  }
  build(model, local_worker, std::move(transport));
}

void StageRunner::build(torch::nn::Sequential& model, int local_worker, std::unique_ptr<Transport> transport) {
  const int num_stages = static_cast<int>(split_.stages.size());
  check_optimizer_options(options_, schedule_);
  check_training_options(options_, schedule_);
  const OptimizerFactory make_optimizer = optimizer_factory(options_);

  std::vector<std::pair<std::string, torch::nn::AnyModule>> named;
  const auto children = model->named_children();
  int64_t i = 0;
  for (const auto& layer : *model) named.emplace_back(children[i++].key(), layer);
  const std::vector<TiedNames> tied =
      find_tied_parameters(named, split_, options_.tied_parameters(), /*untie=*/local_worker < 0);
  if (!tied.empty() && !schedule_.synchronous()) {
    throw std::invalid_argument("conveyor: schedule '" + schedule_.name + "' updates each stage's weights on its own " +
                                "after every micro-batch, so the copies of tied parameter '" + tied[0][0].second +
                                "' would drift apart; tied parameters need a synchronous schedule (sequential, " +
                                "gpipe, 1f1b)");
  }
  // The replicas' gradient reduction, as actions of the schedule: each
  // stage's after its last backward, where it overlaps the worker's
  // remaining actions (unless the given schedule places them itself), and
  // with the parameters sharded their gathers. A stage that holds a tied
  // parameter has no REDUCE_GRAD, placed or given: it reduces at the update,
  // after the sum over the tie's holders.
  if (replicas_ && options_.optimizer() && schedule_.synchronous() && !schedule_.has_sharding()) {
    schedule_ = schedules::place_sharding(schedule_, {schedules::StageSharding{options_.shard()}});
  }
  std::set<int> tied_stages;
  for (const TiedNames& names : tied) {
    for (const auto& holder : names) tied_stages.insert(holder.first);
  }
  for (auto& line : schedule_.sharding) {
    std::erase_if(line, [&](const auto& placed) {
      return placed.action.kind == schedules::ShardKind::kReduceGrad && tied_stages.count(placed.action.stage) > 0;
    });
  }
  // Everything is checked: only now are layers moved to their devices.

  std::vector<std::shared_ptr<Stage>> stages;
  std::vector<c10::Device> devices;
  const uint64_t seed = at::detail::getDefaultCPUGenerator().current_seed();
  for (int k = 0; k < num_stages; ++k) {
    const StageSpec& spec = split_.stages[k];
    devices.push_back(spec.device);
    if (local_worker >= 0 && schedule_.worker_of(k) != local_worker) {
      stages.push_back(nullptr);  // runs in another process
      continue;
    }
    std::vector<std::pair<std::string, torch::nn::AnyModule>> slice(named.begin() + spec.begin,
                                                                    named.begin() + spec.end);
    auto stage = std::make_shared<Stage>(k, std::move(slice), spec.begin, spec.device);
    if (schedule_.weight_stashing) stage->separate_live_weights();
    if (make_optimizer) stage->set_optimizer(make_optimizer(stage->live()));
    if (options_.stage_rng()) stage->enable_random(StageRandom::stage_seed(seed, k));
    stages.push_back(std::move(stage));
  }
  std::vector<TiedParameter> ties;
  for (const TiedNames& names : tied) {
    TiedParameter tie;
    std::vector<std::string> group;
    for (const auto& [k, name] : names) {
      group.push_back(name);
      if (!stages[k]) {
        tie.emplace_back(k, 0);  // another process's stage: only its index matters
        continue;
      }
      // The dict must outlive the pointer that find() returns into it.
      const auto named = stages[k]->module()->named_parameters();
      const at::Tensor* p = named.find(name);
      TORCH_INTERNAL_ASSERT(p, "conveyor: tied parameter ", name, " is not in stage ", k);
      const auto& live = stages[k]->live();
      size_t index = 0;
      while (index < live.size() && live[index].unsafeGetTensorImpl() != p->unsafeGetTensorImpl()) ++index;
      TORCH_INTERNAL_ASSERT(index < live.size(), "conveyor: tied parameter ", name, " is not in stage ", k);
      tie.emplace_back(k, index);
    }
    ties.push_back(std::move(tie));
    tied_names_.push_back(std::move(group));
  }
  if (!transport) transport = make_in_process_transport(devices, channel_capacity_for(options_), options_.timeout());
  std::vector<int> placement;
  for (int k = 0; k < num_stages; ++k) placement.push_back(schedule_.worker_of(k));
  transport->place(placement);
  runtime_ = std::make_unique<Runtime>(std::move(stages), std::move(transport), options_.training(),
                                       options_.running(), schedule_.placement, replicas_, std::move(ties));
  runtime_->unify_tied_values();
}

StageRunner::~StageRunner() = default;
StageRunner::StageRunner(StageRunner&&) noexcept = default;
StageRunner& StageRunner::operator=(StageRunner&&) noexcept = default;

int StageRunner::num_stages() const { return runtime_->num_stages(); }
bool StageRunner::is_local(int k) const { return runtime_->is_local(k); }
const Stage& StageRunner::stage(int k) const { return runtime_->stage(k); }
int64_t StageRunner::completed_steps() const { return runtime_->completed_steps(); }

void StageRunner::restore_progress(int64_t completed_steps, const std::vector<int64_t>& stage_updates) {
  check_argument(static_cast<int>(stage_updates.size()) == num_stages(), "conveyor: restore_progress needs ",
                 num_stages(), " update counts, got ", stage_updates.size());
  runtime_->restore_completed_steps(completed_steps);
  for (int k = 0; k < num_stages(); ++k) {
    if (is_local(k)) runtime_->stage(k).restore_updates(stage_updates[k]);
  }
}

StepResult StageRunner::train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn) {
  if (!loss_fn) throw std::invalid_argument("conveyor: train_step needs a loss function");
  if (!input.defined()) throw std::invalid_argument("conveyor: the input is undefined");
  if (!target.defined()) throw std::invalid_argument("conveyor: the target is undefined");
  const TensorsLossFn on_one = [&loss_fn](const Tensors& outputs, const Tensors& targets) {
    TORCH_CHECK(outputs.size() == 1, "the last stage returns ", outputs.size(), " tensors, but the loss function ",
                "takes one: give train_step a loss function of Tensors");
    return loss_fn(outputs[0], targets[0]);
  };
  return train_step(Tensors{input}, Tensors{target}, on_one);
}

StepResult StageRunner::train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn) {
  if (!loss_fn) throw std::invalid_argument("conveyor: train_step needs a loss function");
  const int m = options_.microbatches();
  StepData data;
  const int64_t dim = options_.batch_dim();
  const int64_t n = split_microbatches(inputs, "input", options_.shared_inputs(), dim, m, data.inputs);
  const int64_t n_targets = split_microbatches(targets, "target", options_.shared_targets(), dim, m, data.targets);
  check_argument(n_targets == n, "conveyor: the input has ", n, " samples along dimension ", options_.batch_dim(),
                 " but the target has ", n_targets);
  std::vector<int64_t> samples;  // as tensor_split cuts: the first n % m one larger
  for (int i = 0; i < m; ++i) samples.push_back(n / m + (i < n % m ? 1 : 0));
  return train(data, samples, loss_fn);
}

StepResult StageRunner::train_microbatches(const std::vector<Tensors>& inputs, const std::vector<Tensors>& targets,
                                        const TensorsLossFn& loss_fn) {
  if (!loss_fn) throw std::invalid_argument("conveyor: train_microbatches needs a loss function");
  const int m = options_.microbatches();
  check_argument(static_cast<int>(inputs.size()) == m && static_cast<int>(targets.size()) == m,
                 "conveyor: train_microbatches was given ", inputs.size(), " input and ", targets.size(),
                 " target micro-batches; the pipeline runs ", m);
  StepData data;
  std::vector<int64_t> samples;
  for (int i = 0; i < m; ++i) {
    std::vector<Tensors> one;
    const int64_t n = split_microbatches(inputs[i], "input", options_.shared_inputs(), options_.batch_dim(), 1, one);
    data.inputs.push_back(std::move(one[0]));
    const int64_t n_targets =
        split_microbatches(targets[i], "target", options_.shared_targets(), options_.batch_dim(), 1, one);
    check_argument(n_targets == n, "conveyor: micro-batch ", i,
                   "'s inputs and targets differ in their number of samples");
    data.targets.push_back(std::move(one[0]));
    samples.push_back(n);
  }
  return train(data, samples, loss_fn);
}

StepResult StageRunner::train(StepData& data, const std::vector<int64_t>& samples, const TensorsLossFn& loss_fn) {
  // The reported loss is the batch's; what each backward starts from is the
  // batch's loss (synchronous: the gradients are the whole batch's) or the
  // micro-batch's own (asynchronous: each micro-batch is a mini-batch).
  const bool mean = options_.loss_reduction() == LossReduction::kMean;
  int64_t n = 0;
  for (int64_t s : samples) n += s;
  // Accumulating over n steps, each step's mean counts 1/n; a loss scaler
  // multiplies every micro-batch's loss by its scale.
  const int window = options_.accumulate_steps();
  const double accumulate = mean ? 1.0 / window : 1.0;
  const LossScaler* scaler = runtime_->loss_scaler();
  const double scale = scaler ? scaler->scale() : 1.0;
  for (int64_t s : samples) {
    const double share = mean ? static_cast<double>(s) / static_cast<double>(n) : 1.0;
    data.report_weight.push_back(share);
    data.loss_scale.push_back((schedule_.synchronous() ? share * accumulate : 1.0) * scale);
  }
  data.loss_fn = &loss_fn;
  data.update = accumulated_ + 1 >= window;
  StepResult result;
  try {
    result = runtime_->run(schedule_, data);
  } catch (...) {
    accumulated_ = 0;  // the failed step's gradients, and the window's, are dropped
    throw;
  }
  accumulated_ = data.update ? 0 : accumulated_ + 1;
  return result;
}

double StageRunner::clip_grad_norm(double max_norm, double norm_type) {
  return runtime_->clip_grad_norm(max_norm, norm_type);
}

std::optional<LossScalerState> StageRunner::loss_scaler_state() const {
  const LossScaler* scaler = runtime_->loss_scaler();
  if (!scaler) return std::nullopt;
  return scaler->state();
}

void StageRunner::restore_loss_scaler(const LossScalerState& state) {
  LossScaler* scaler = runtime_->loss_scaler();
  if (!scaler) {
    throw std::invalid_argument("conveyor: this pipeline has no loss scaler (PipelineOptions::loss_scaling)");
  }
  scaler->restore(state);
}

at::Tensor StageRunner::forward(const at::Tensor& input) {
  if (!input.defined()) throw std::invalid_argument("conveyor: the input is undefined");
  const Tensors out = forward(Tensors{input});
  if (out.empty()) return at::Tensor();  // the output is in another process
  check_argument(out.size() == 1, "conveyor: the last stage returns ", out.size(),
                 " tensors; call forward with Tensors");
  return out[0];
}

Tensors StageRunner::forward(const Tensors& inputs) {
  int64_t n = 0;
  const auto& shared = options_.shared_inputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool is_shared = std::find(shared.begin(), shared.end(), static_cast<int64_t>(i)) != shared.end();
    if (!is_shared && inputs[i].defined() && inputs[i].dim() > options_.batch_dim()) {
      n = inputs[i].size(options_.batch_dim());
      break;
    }
  }
  const int m = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(options_.microbatches(), n)));
  StepData data;
  split_microbatches(inputs, "input", shared, options_.batch_dim(), m, data.inputs);
  std::vector<Tensors> outputs;
  runtime_->run(schedules::make_forward_only(num_stages(), m, schedule_.placement), data, &outputs);
  if (!is_local(num_stages() - 1)) return {};  // the output is in another process
  return join_microbatches(outputs, options_.batch_dim());
}

std::vector<at::Tensor> StageRunner::parameters() const {
  std::vector<at::Tensor> params;
  for (int k = 0; k < num_stages(); ++k) {
    if (!is_local(k)) continue;
    for (const auto& p : stage(k).live()) params.push_back(p);
  }
  return params;
}

std::vector<std::pair<std::string, at::Tensor>> StageRunner::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (int k = 0; k < num_stages(); ++k) {
    if (!is_local(k)) continue;
    for (size_t i = 0; i < stage(k).live().size(); ++i) params.emplace_back(stage(k).names()[i], stage(k).live()[i]);
  }
  return params;
}

void StageRunner::train(bool on) {
  for (int k = 0; k < num_stages(); ++k) {
    if (is_local(k)) stage(k).module()->train(on);
  }
}

namespace {

template <typename OfStage>
std::vector<std::pair<std::string, at::Tensor>> pipeline_named(const StageRunner& pipe, OfStage of_stage) {
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (int k = 0; k < pipe.num_stages(); ++k) {
    if (!pipe.is_local(k)) continue;  // its tensors live in another process
    for (auto& item : of_stage(pipe.stage(k))) named.push_back(std::move(item));
  }
  return named;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> model_named_parameters(const StageRunner& pipe) {
  return pipeline_named(pipe, [](const Stage& s) { return model_named_parameters(s); });
}

std::vector<std::pair<std::string, at::Tensor>> model_named_buffers(const StageRunner& pipe) {
  return pipeline_named(pipe, [](const Stage& s) { return model_named_buffers(s); });
}

}  // namespace conveyor
