#include "plugin/pipeline.h"

#include "schedules/generators.h"
#include "schedules/validate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages) {
  if (options.microbatches() < 1) {
    throw std::invalid_argument("conveyor: microbatches must be at least 1, got " +
                                std::to_string(options.microbatches()));
  }
  schedules::Schedule schedule;
  try {
    if (options.schedule_text().empty()) {
      schedule =
          schedules::make_schedule(options.schedule(), num_stages, options.microbatches(), options.vertical_sync());
    } else {
      schedule = schedules::Schedule::parse(options.schedule_text());
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("conveyor: ") + e.what());
  }
  if (schedule.num_stages != num_stages || schedule.num_microbatches != options.microbatches()) {
    std::ostringstream os;
    os << "conveyor: the schedule is for " << schedule.num_stages << " stages and " << schedule.num_microbatches
       << " micro-batches, the pipeline has " << num_stages << " stages and " << options.microbatches();
    throw std::invalid_argument(os.str());
  }
  try {
    schedules::validate(schedule, schedules::ValidateOptions{options.channel_capacity(), true});
  } catch (const std::exception& e) {
    throw std::invalid_argument("conveyor: schedule '" + schedule.name + "' cannot run on this pipeline: " + e.what());
  }
  return schedule;
}

// The optimizer and learning-rate options must fit how the schedule updates.
void check_optimizer_options(const PipelineOptions& options, const schedules::Schedule& schedule) {
  const std::string name = "'" + schedule.name + "'";
  if (!schedule.synchronous() && !options.optimizer()) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " steps the optimizer after every micro-batch on every stage, so the pipeline needs "
                                "its own: give PipelineOptions::optimizer(factory)");
  }
  if (options.lr_schedule() && !options.optimizer()) {
    throw std::invalid_argument(
        "conveyor: lr_schedule needs the pipeline's own optimizer (PipelineOptions::optimizer)");
  }
  if (!options.lr_schedule()) return;
  if (!schedule.synchronous() && options.lr_schedule_unit() != UpdateUnit::kMicrobatch) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " updates the weights after every micro-batch, but the learning-rate schedule counts "
                                "batches: give lr_schedule_unit(UpdateUnit::kMicrobatch) and a schedule over updates");
  }
  if (schedule.synchronous() && options.lr_schedule_unit() != UpdateUnit::kBatch) {
    throw std::invalid_argument("conveyor: schedule " + name +
                                " updates the weights once per batch, but the learning-rate schedule counts "
                                "micro-batches: give lr_schedule_unit(UpdateUnit::kBatch)");
  }
}

}  // namespace

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options)
    : options_(std::move(options)), plan_(plan_stages(model, options_)) {
  build(model, -1, nullptr);
}

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options, int local_stage,
                   std::unique_ptr<Transport> transport)
    : options_(std::move(options)), plan_(plan_stages(model, options_)) {
  const int num_stages = static_cast<int>(plan_.stages.size());
  if (local_stage < 0 || local_stage >= num_stages) {
    throw std::invalid_argument("conveyor: local stage " + std::to_string(local_stage) + " is not a stage of this " +
                                std::to_string(num_stages) + "-stage pipeline");
  }
  if (!transport) throw std::invalid_argument("conveyor: a pipeline with one local stage needs a transport");
  build(model, local_stage, std::move(transport));
}

void Pipeline::build(torch::nn::Sequential& model, int local_stage, std::unique_ptr<Transport> transport) {
  const int num_stages = static_cast<int>(plan_.stages.size());
  schedule_ = build_schedule(options_, num_stages);
  check_optimizer_options(options_, schedule_);
  if (options_.timeout().count() <= 0) throw std::invalid_argument("conveyor: timeout must be positive");

  // Everything is checked: only now are layers moved to their devices.
  std::vector<std::pair<std::string, torch::nn::AnyModule>> named;
  const auto children = model->named_children();
  int64_t i = 0;
  for (const auto& layer : *model) named.emplace_back(children[i++].key(), layer);

  std::vector<std::shared_ptr<Stage>> stages;
  std::vector<c10::Device> devices;
  const uint64_t seed = at::detail::getDefaultCPUGenerator().current_seed();
  for (int k = 0; k < num_stages; ++k) {
    const StageSpec& spec = plan_.stages[k];
    devices.push_back(spec.device);
    if (local_stage >= 0 && k != local_stage) {
      stages.push_back(nullptr);  // runs in another process
      continue;
    }
    std::vector<std::pair<std::string, torch::nn::AnyModule>> slice(named.begin() + spec.begin,
                                                                    named.begin() + spec.end);
    auto stage = std::make_shared<Stage>(k, std::move(slice), spec.begin, spec.device);
    if (schedule_.weight_stashing) stage->separate_live_weights();
    if (options_.optimizer()) stage->set_optimizer(options_.optimizer()(stage->live()));
    if (options_.stage_rng()) stage->enable_random(StageRandom::stage_seed(seed, k));
    stages.push_back(std::move(stage));
  }
  RuntimeOptions runtime_options;
  runtime_options.trace = options_.trace();
  runtime_options.divergence_guard = options_.divergence_guard();
  runtime_options.learning_rate = options_.lr_schedule();
  if (!transport) transport = make_in_process_transport(devices, options_.channel_capacity(), options_.timeout());
  runtime_ = std::make_unique<Runtime>(std::move(stages), std::move(transport), std::move(runtime_options));
}

void Pipeline::restore_progress(int64_t completed_steps, const std::vector<int64_t>& stage_updates) {
  TORCH_CHECK(static_cast<int>(stage_updates.size()) == num_stages(), "conveyor: restore_progress needs ", num_stages(),
              " update counts, got ", stage_updates.size());
  runtime_->restore_completed_steps(completed_steps);
  for (int k = 0; k < num_stages(); ++k) {
    if (is_local(k)) runtime_->stage(k).restore_updates(stage_updates[k]);
  }
}

std::vector<at::Tensor> Pipeline::split(const at::Tensor& batch, const char* what, int num_microbatches) const {
  if (!batch.defined()) throw std::invalid_argument(std::string("conveyor: the ") + what + " is undefined");
  const int64_t dim = options_.batch_dim();
  if (batch.dim() <= dim) {
    std::ostringstream os;
    os << "conveyor: the " << what << " has shape " << batch.sizes() << ", which has no batch dimension " << dim;
    throw std::invalid_argument(os.str());
  }
  const int64_t n = batch.size(dim);
  if (n < num_microbatches) {
    std::ostringstream os;
    os << "conveyor: a batch of " << n << " samples cannot be split into " << num_microbatches
       << " micro-batches: each needs at least one sample (use a batch of at least " << num_microbatches
       << " or fewer micro-batches)";
    throw std::invalid_argument(os.str());
  }
  return batch.tensor_split(num_microbatches, dim);
}

StepResult Pipeline::train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn) {
  if (!loss_fn) throw std::invalid_argument("conveyor: train_step needs a loss function");
  const int m = options_.microbatches();
  StepData data;
  data.inputs = split(input, "input", m);
  data.targets = split(target, "target", m);
  const int64_t n = input.size(options_.batch_dim());
  if (target.size(options_.batch_dim()) != n) {
    std::ostringstream os;
    os << "conveyor: the input has " << n << " samples along dimension " << options_.batch_dim()
       << " but the target has " << target.size(options_.batch_dim());
    throw std::invalid_argument(os.str());
  }
  // The reported loss is the batch's; what each backward starts from is the
  // batch's loss (synchronous: the gradients are the whole batch's) or the
  // micro-batch's own (asynchronous: each micro-batch is a mini-batch).
  const bool mean = options_.loss_reduction() == LossReduction::kMean;
  for (const auto& mb : data.inputs) {
    const double share = mean ? static_cast<double>(mb.size(options_.batch_dim())) / static_cast<double>(n) : 1.0;
    data.report_weight.push_back(share);
    data.loss_scale.push_back(schedule_.synchronous() ? share : 1.0);
  }
  data.loss_fn = &loss_fn;
  return runtime_->run(schedule_, data);
}

at::Tensor Pipeline::forward(const at::Tensor& input) {
  if (!input.defined()) throw std::invalid_argument("conveyor: the input is undefined");
  const int64_t n = input.dim() > options_.batch_dim() ? input.size(options_.batch_dim()) : 0;
  const int m = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(options_.microbatches(), n)));
  StepData data;
  data.inputs = split(input, "input", m);
  std::vector<at::Tensor> outputs;
  runtime_->run(schedules::make_forward_only(num_stages(), m), data, &outputs);
  if (!is_local(num_stages() - 1)) return at::Tensor();  // the output is in another process
  return at::cat(outputs, options_.batch_dim());
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> params;
  for (int k = 0; k < num_stages(); ++k) {
    if (!is_local(k)) continue;
    for (const auto& p : stage(k).live()) params.push_back(p);
  }
  return params;
}

std::vector<std::pair<std::string, at::Tensor>> Pipeline::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (int k = 0; k < num_stages(); ++k) {
    if (!is_local(k)) continue;
    for (size_t i = 0; i < stage(k).live().size(); ++i) params.emplace_back(stage(k).names()[i], stage(k).live()[i]);
  }
  return params;
}

void Pipeline::train(bool on) {
  for (int k = 0; k < num_stages(); ++k) {
    if (is_local(k)) stage(k).module()->train(on);
  }
}

}  // namespace conveyor
