#include "plugin/pipeline.h"

#include "schedules/generators.h"
#include "schedules/validate.h"

#include <ATen/ATen.h>
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
      schedule = schedules::make_schedule(options.schedule(), num_stages, options.microbatches());
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

}  // namespace

Pipeline::Pipeline(torch::nn::Sequential model, PipelineOptions options)
    : options_(std::move(options)), plan_(plan_stages(model, options_)) {
  const int num_stages = static_cast<int>(plan_.stages.size());
  schedule_ = build_schedule(options_, num_stages);
  if (options_.timeout().count() <= 0) throw std::invalid_argument("conveyor: timeout must be positive");

  // Everything is checked: only now are layers moved to their devices.
  std::vector<std::pair<std::string, torch::nn::AnyModule>> named;
  const auto children = model->named_children();
  int64_t i = 0;
  for (const auto& layer : *model) named.emplace_back(children[i++].key(), layer);

  std::vector<std::shared_ptr<Stage>> stages;
  std::vector<c10::Device> devices;
  for (int k = 0; k < num_stages; ++k) {
    const StageSpec& spec = plan_.stages[k];
    std::vector<std::pair<std::string, torch::nn::AnyModule>> slice(named.begin() + spec.begin,
                                                                     named.begin() + spec.end);
    stages.push_back(std::make_shared<Stage>(k, std::move(slice), spec.begin, spec.device));
    devices.push_back(spec.device);
  }
  runtime_ = std::make_unique<Runtime>(
      std::move(stages), make_in_process_transport(devices, options_.channel_capacity(), options_.timeout()),
      options_.trace());
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
  for (const auto& mb : data.inputs) {
    const double share = static_cast<double>(mb.size(options_.batch_dim())) / static_cast<double>(n);
    data.loss_weights.push_back(options_.loss_reduction() == LossReduction::kMean ? share : 1.0);
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
  return at::cat(outputs, options_.batch_dim());
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> params;
  for (int k = 0; k < num_stages(); ++k) {
    for (const auto& p : stage(k).module()->parameters()) params.push_back(p);
  }
  return params;
}

std::vector<std::pair<std::string, at::Tensor>> Pipeline::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (int k = 0; k < num_stages(); ++k) {
    for (const auto& p : stage(k).module()->named_parameters()) params.emplace_back(p.key(), p.value());
  }
  return params;
}

void Pipeline::train(bool on) {
  for (int k = 0; k < num_stages(); ++k) stage(k).module()->train(on);
}

}  // namespace conveyor
