#include "plugin/builder/builder.h"

#include "plugin/errors.h"
#include "plugin/model/model_names.h"
#include "plugin/model/stage.h"
#include "schedules/generators.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace conveyor {

namespace {

// `request` checked for its own groups' processes (none: one process).
CheckedRequest checked(BuildRequest request) {
  const int processes = request.groups ? request.groups->layout().workers : 0;
  return CheckedRequest(std::move(request), processes);
}

}  // namespace

void check_request(const BuildRequest& request, int processes) {
  count_request(RequestStage::kCheck);
  const bool across_processes = processes > 0;
  check_bounds(request.pipeline);
  check_bounds(request.build);
  check_bounds(request.distributed);
  if (optimizer_from(request.build)) {
    check_argument(!request.pipeline.optimizer(), "conveyor: give the pipeline's optimizer once: by name ",
                   "(BuildOptions) or as a factory (PipelineOptions), not both");
  }
  PipelineOptions options = request.pipeline;
  if (options.schedule_text().empty()) (void)schedules::make_schedule(options.schedule(), 2, 4);  // a known name
  if (across_processes && options.workers() == 0) options.workers(processes);  // one worker per process
  check_split_point_count(options, request.build.split_points());
  check_plan(options, request.build,
             {.sample = request.sample ? &*request.sample : nullptr, .loss = request.loss,
              .across_processes = across_processes});
}

CheckedRequest::CheckedRequest(BuildRequest request, int processes)
    : request_(std::move(request)), processes_(processes) {
  check_request(request_, processes_);
}

void CheckedRequest::attach_loss(TensorsLossFn loss) {
  check_argument(static_cast<bool>(request_.loss) == static_cast<bool>(loss),
                 "conveyor: the request was checked ", request_.loss ? "with" : "without", " a loss");
  request_.loss = std::move(loss);
}

void CheckedRequest::attach_lr_schedule(LearningRateSchedule schedule) {
  request_.pipeline.lr_schedule(std::move(schedule));
}

void CheckedRequest::attach_groups(std::shared_ptr<ProcessGroups> groups) {
  check_argument(groups != nullptr && groups->layout().workers == processes_, "conveyor: the request was checked for ",
                 processes_, " processes, not the ", groups ? groups->layout().workers : 0, " of these groups");
  request_.groups = std::move(groups);
}

BuiltPipeline::BuiltPipeline(const Model& model, BuildRequest request)
    : BuiltPipeline(model, checked(std::move(request))) {}

BuiltPipeline::BuiltPipeline(const Model& model, CheckedRequest checked) : model_(model) {
  BuildRequest request = std::move(checked.request_);
  const bool across_processes = request.groups != nullptr;
  build_ = std::move(request.build);
  distributed_options_ = std::move(request.distributed);
  loss_ = std::move(request.loss);
  PipelineOptions options = std::move(request.pipeline);
  if (const OptimizerFactory named = optimizer_from(build_)) options.optimizer(named);
  // One worker per process: the pipeline group's size is the number of workers.
  if (across_processes && options.workers() == 0) options.workers(request.groups->layout().workers);
  const bool given_cut = !build_.split_points().empty() || !options.boundaries().empty();
  // 1. The model as layers.
  ModelLayers layers = model_layers(model_, build_, options);
  fused_ops_report_ = layers.fused_ops_report;
  aliases_ = std::move(layers.aliases);
  transient_buffers_ = std::move(layers.transient_buffers);
  // 2. The plan.
  const SampleBatch* sample = request.sample ? &*request.sample : nullptr;
  PlannedOptions planned =
      plan_pipeline(layers.layers, std::move(options), build_, {.sample = sample, .loss = loss_,
                                                                .across_processes = across_processes,
                                                                .checked = true});
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

namespace {

// Each name once, at its first place: a buffer read by several stages, and
// the later stages' copies of a tied weight in state_entries(), carry its
// name too.
std::vector<std::pair<std::string, at::Tensor>> first_of_each(std::vector<std::pair<std::string, at::Tensor>> named) {
  std::set<std::string> seen;
  std::erase_if(named, [&](const auto& item) { return !seen.insert(item.first).second; });
  return named;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::named_parameters() const {
  // The stages' own names of the parameters (the Sequential's), which the tie groups use.
  std::vector<std::string> layer_names;
  for (int k = 0; k < pipe_->num_stages(); ++k) {
    if (!pipe_->is_local(k)) continue;
    for (const auto& item : pipe_->stage(k).module()->named_parameters()) layer_names.push_back(item.key());
  }
  const std::set<std::string> local(layer_names.begin(), layer_names.end());
  // A tied weight is listed at its first holder in this process: the
  // pipeline gives the later holders its value (across processes, each
  // process steps its own holder with the summed gradient).
  std::set<std::string> later;
  for (const auto& group : pipe_->tied_parameters()) {
    bool first = true;
    for (const std::string& name : group) {
      if (!local.count(name)) continue;
      if (!first) later.insert(name);
      first = false;
    }
  }
  const auto named = model_named_parameters(*pipe_);  // in the stages' order, as layer_names
  TORCH_INTERNAL_ASSERT(named.size() == layer_names.size(), "conveyor: a stage's parameters changed names");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < named.size(); ++i) {
    if (!later.count(layer_names[i])) out.push_back(named[i]);
  }
  return out;
}

std::vector<at::Tensor> BuiltPipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(std::move(t));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::named_buffers() const {
  return first_of_each(model_named_buffers(*pipe_));
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::state_dict() const {
  return first_of_each(state_entries());
}

std::vector<std::pair<std::string, at::Tensor>> BuiltPipeline::state_entries() const {
  auto state = model_named_parameters(*pipe_);
  for (auto& b : model_named_buffers(*pipe_)) {
    const bool transient =
        std::find(transient_buffers_.begin(), transient_buffers_.end(), b.first) != transient_buffers_.end();
    if (!transient) state.push_back(std::move(b));
  }
  const size_t held = state.size();
  for (const auto& [alias, name] : aliases_) {
    for (size_t i = 0; i < held; ++i) {
      if (state[i].first == name) state.emplace_back(alias, state[i].second);
    }
  }
  for (auto& [name, t] : state) t = t.detach();
  return state;
}

BuiltPipeline::IncompatibleKeys BuiltPipeline::load_state_dict(
    const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict) {
  const auto tensors = state_entries();  // every copy of a tied weight takes its value
  const std::map<std::string, at::Tensor> given(state.begin(), state.end());
  IncompatibleKeys keys;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    const bool first = names.insert(name).second;
    const auto it = given.find(name);
    if (it == given.end()) {
      if (first) keys.missing.push_back(name);
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
