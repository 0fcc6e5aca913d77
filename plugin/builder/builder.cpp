#include "plugin/builder/builder.h"

#include "plugin/errors.h"
#include "plugin/model/model_names.h"

#include <c10/util/StringUtil.h>

#include <map>
#include <set>
#include <stdexcept>

namespace conveyor {

BuiltPipeline::BuiltPipeline(const Model& model, BuildRequest request)
    : model_(model), build_(std::move(request.build)), distributed_options_(std::move(request.distributed)),
      loss_(std::move(request.loss)) {
  PipelineOptions options = std::move(request.pipeline);
  check_bounds(options);
  check_bounds(build_);
  check_bounds(distributed_options_);
  if (const OptimizerFactory named = optimizer_from(build_)) {
    check_argument(!options.optimizer(), "conveyor: give the pipeline's optimizer once: by name (BuildOptions) or ",
                   "as a factory (PipelineOptions), not both");
    options.optimizer(named);
  }
  const bool across_processes = request.groups != nullptr;
  // One worker per process: the pipeline group's size is the number of workers.
  if (across_processes && options.workers() == 0) options.workers(request.groups->layout().workers);
  const bool given_cut = !build_.split_points().empty() || !options.boundaries().empty();
  // 1. The model as layers.
  ModelLayers layers = model_layers(model_, build_, options);
  fused_ops_report_ = layers.fused_ops_report;
  // 2. The plan.
  const SampleBatch* sample = request.sample ? &*request.sample : nullptr;
  PlannedOptions planned =
      plan_pipeline(layers.layers, std::move(options), build_, {.sample = sample, .loss = loss_,
                                                                .across_processes = across_processes});
  search_text_ = std::move(planned.search);
  // 3. The runtime.
  if (across_processes) {
    distributed_ = std::make_unique<DistributedPipeline>(layers.layers, std::move(planned.options),
                                                         std::move(request.groups), distributed_options_);
    pipe_ = &distributed_->pipeline();
  } else {
    local_ = std::make_unique<Pipeline>(layers.layers, std::move(planned.options));
    pipe_ = local_.get();
  }
  if (const auto& profile = pipe_->options().profile(); profile && sample) {
    plan_ = predict(*profile, pipe_->plan(), pipe_->schedule(), batch_size(*sample, pipe_->options()),
                    pipe_->options());
    plan_->balance = build_.plan() != PlanMode::kGiven ? "searched" : given_cut ? "given boundaries" : "time";
  }
}

const StepResult& BuiltPipeline::train_step(const Tensors& inputs, const Tensors& targets) {
  check_argument(static_cast<bool>(loss_), "conveyor: train_step needs a loss: give BuildRequest::loss");
  last_ = distributed_ ? distributed_->train_step(inputs, targets, loss_) : pipe_->train_step(inputs, targets, loss_);
  return last_;
}

Tensors BuiltPipeline::forward(const Tensors& inputs) {
  return distributed_ ? distributed_->forward(inputs) : pipe_->forward(inputs);
}

double BuiltPipeline::clip_grad_norm(double max_norm, double norm_type) {
  return distributed_ ? distributed_->clip_grad_norm(max_norm, norm_type) : pipe_->clip_grad_norm(max_norm, norm_type);
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::named_parameters() const {
  return model_named_parameters(*pipe_);
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::named_buffers() const {
  return model_named_buffers(*pipe_);
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::state_dict() const {
  auto state = named_parameters();
  for (auto& b : named_buffers()) state.push_back(std::move(b));
  for (auto& [name, t] : state) t = t.detach();
  return state;
}

BuiltPipeline::IncompatibleKeys BuiltPipeline::load_state_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict) {
  const auto tensors = state_dict();
  const std::map<std::string, at::Tensor> given(state.begin(), state.end());
  IncompatibleKeys keys;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    names.insert(name);
    const auto it = given.find(name);
    if (it == given.end()) {
      keys.missing.push_back(name);
      continue;
    }
    check_argument(it->second.sizes().equals(t.sizes()), "conveyor.Pipeline.load_state_dict: '", name,
                   "' has shape ", it->second.sizes(), ", the pipeline's has ", t.sizes());
  }
  for (const auto& [name, value] : state) {
    if (!names.count(name)) keys.unexpected.push_back(name);
  }
  if (strict && (!keys.missing.empty() || !keys.unexpected.empty())) {
    const std::string first = !keys.missing.empty() ? "missing '" + keys.missing[0] + "'"
                                                    : "unexpected '" + keys.unexpected[0] + "'";
    throw std::invalid_argument(c10::str("conveyor.Pipeline.load_state_dict: ", first, " (", keys.missing.size(),
                                         " missing, ", keys.unexpected.size(),
                                         " unexpected; strict=False loads the rest)"));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) {
    if (const auto it = given.find(name); it != given.end()) t.copy_(it->second);
  }
  return keys;
}

}  // namespace conveyor
