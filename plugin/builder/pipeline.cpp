#include "plugin/pipeline.h"

#include "plugin/checkpoint/model_state.h"
#include "plugin/distributed/distributed_runner.h"
#include "plugin/distributed/sharded_optimizer.h"
#include "plugin/runner/stage_runner.h"
#include "plugin/core/errors.h"
#include "plugin/model/model_names.h"
#include "plugin/model/stage.h"
#include "schedules/generators.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace conveyor {

CheckedRequest Pipeline::check(BuildRequest request, const Model& model) {
  const int processes = request.groups ? request.groups->layout().workers : 0;
  return CheckedRequest(std::move(request), processes, model_kind(model));
}

Pipeline::Pipeline(const Model& model, PipelineOptions options, std::shared_ptr<ProcessGroups> groups)
    : Pipeline(model, BuildRequest{.options = std::move(options), .groups = std::move(groups)}) {}

Pipeline::Pipeline(const Model& model, BuildRequest request) : Pipeline(model, check(std::move(request), model)) {}

Pipeline::Pipeline(const Model& model, CheckedRequest checked) {
  const std::optional<ModelKind> checked_kind = checked.kind_;
  BuildRequest request = std::move(checked.request_);
  const bool across_processes = request.groups != nullptr;
  loss_ = std::move(request.loss);
  PipelineOptions options = std::move(request.options);
  // One worker per process: the pipeline group's size is the number of workers.
  if (across_processes && options.workers() == 0) options.workers(request.groups->layout().workers);
  const PipelineOptions given = options;
  const bool given_cut = !options.split_points().empty() || !options.boundaries().empty();
  // 1. The model as layers.
  ModelLayers layers = model_layers(model, options, checked_kind);
  fused_ops_report_ = layers.fused_ops_report;
  aliases_ = std::move(layers.aliases);
  transient_buffers_ = std::move(layers.transient_buffers);
  // 2. The plan.
  const SampleBatch* sample = request.sample ? &*request.sample : nullptr;
  const PlanMode mode = options.plan();
  Plan planned = decide_plan(layers.layers, std::move(options),
                             {.sample = sample,
                              .loss = loss_,
                              .batch_size = request.batch_size,
                              .across_processes = across_processes,
                              .checked = true});
  search_text_ = std::move(planned.search);
  // The options as given with the plan's choices: the front end's own
  // changes (the split points' boundaries, tied names among the layers) undone.
  options_ = planned.options;
  if (!given.split_points().empty()) options_.boundaries(given.boundaries());
  options_.tied_parameters(given.tied_parameters());
  // 3. The runner.
  if (across_processes) {
    distributed_ = std::make_unique<DistributedRunner>(layers.layers, std::move(planned.options),
                                                       std::move(request.groups), OptionValuesChecked{});
  } else {
    local_ = std::make_unique<StageRunner>(layers.layers, std::move(planned.options), OptionValuesChecked{});
  }
  const StageRunner& built = runner();
  if (const auto& profile = built.options().profile(); profile && (sample || request.batch_size > 0)) {
    const int64_t batch = sample ? batch_size(*sample, built.options()) : request.batch_size;
    prediction_ = predict_step(*profile, built.split(), built.schedule(), batch, built.options());
    prediction_->balance = mode != PlanMode::kGiven ? "searched" : given_cut ? "given boundaries" : "time";
  }
}

Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

StageRunner& Pipeline::runner() { return distributed_ ? distributed_->runner() : *local_; }
const StageRunner& Pipeline::runner() const { return distributed_ ? distributed_->runner() : *local_; }

const StepResult& Pipeline::train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss) {
  last_ = distributed_ ? distributed_->train_step(input, target, loss) : local_->train_step(input, target, loss);
  return last_;
}

const StepResult& Pipeline::train_step(const at::Tensor& input, const at::Tensor& target) {
  return train_step(Tensors{input}, Tensors{target});
}

const StepResult& Pipeline::train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss) {
  last_ = distributed_ ? distributed_->train_step(inputs, targets, loss) : local_->train_step(inputs, targets, loss);
  return last_;
}

const StepResult& Pipeline::train_step(const Tensors& inputs, const Tensors& targets) {
  check_argument(static_cast<bool>(loss_), "conveyor: train_step needs a loss: pass one, or give BuildRequest::loss");
  return train_step(inputs, targets, loss_);
}

const StepResult& Pipeline::train_step(std::initializer_list<at::Tensor> inputs,
                                       std::initializer_list<at::Tensor> targets, const TensorsLossFn& loss) {
  return train_step(Tensors(inputs), Tensors(targets), loss);
}

const StepResult& Pipeline::train_step(std::initializer_list<at::Tensor> inputs,
                                       std::initializer_list<at::Tensor> targets) {
  return train_step(Tensors(inputs), Tensors(targets));
}

const StepResult& Pipeline::train_microbatches(const std::vector<Tensors>& inputs,
                                               const std::vector<Tensors>& targets, const TensorsLossFn& loss) {
  last_ = distributed_ ? distributed_->train_microbatches(inputs, targets, loss)
                       : local_->train_microbatches(inputs, targets, loss);
  return last_;
}

at::Tensor Pipeline::forward(const at::Tensor& input) {
  return distributed_ ? distributed_->forward(input) : local_->forward(input);
}

Tensors Pipeline::forward(const Tensors& inputs) {
  return distributed_ ? distributed_->forward(inputs) : local_->forward(inputs);
}

Tensors Pipeline::forward(std::initializer_list<at::Tensor> inputs) { return forward(Tensors(inputs)); }

double Pipeline::clip_grad_norm(double max_norm, double norm_type) {
  return distributed_ ? distributed_->clip_grad_norm(max_norm, norm_type) : local_->clip_grad_norm(max_norm, norm_type);
}

void Pipeline::train(bool on) { runner().train(on); }
int Pipeline::num_stages() const { return runner().num_stages(); }
int Pipeline::num_workers() const { return runner().num_workers(); }
const schedules::Schedule& Pipeline::schedule() const { return runner().schedule(); }
const StageSplit& Pipeline::split() const { return runner().split(); }
int64_t Pipeline::completed_steps() const { return runner().completed_steps(); }

int64_t Pipeline::optimizer_state_bytes() const {
  int64_t bytes = 0;
  const StageRunner& r = runner();
  for (int k = 0; k < r.num_stages(); ++k) {
    if (!r.is_local(k)) continue;
    if (const torch::optim::Optimizer* optimizer = r.stage(k).optimizer()) {
      bytes += conveyor::optimizer_state_bytes(*optimizer);
    }
  }
  return bytes;
}

std::string Pipeline::plan_text() const {
  return !search_text_.empty() ? search_text_ : prediction_ ? prediction_->str() : runner().split().str();
}

bool Pipeline::is_logging_rank() const { return !distributed_ || distributed_->is_logging_rank(); }

double Pipeline::learning_rate(double base) const { return distributed_ ? distributed_->learning_rate(base) : base; }

void save_checkpoint(const std::string& path, const Pipeline& pipe, const TrainingState& state) {
  save_checkpoint(path, pipe.runner(), state);
}

int64_t load_checkpoint(const std::string& path, Pipeline& pipe,
                        const std::vector<torch::optim::Optimizer*>& optimizers) {
  return load_checkpoint(path, pipe.runner(), optimizers);
}

int64_t load_checkpoint_files(const std::vector<std::string>& paths, Pipeline& pipe,
                              const std::vector<torch::optim::Optimizer*>& optimizers) {
  return load_checkpoint_files(paths, pipe.runner(), optimizers);
}

void save_model_state(const std::string& path, const Pipeline& pipe) {
  check_argument(pipe.distributed() == nullptr, "conveyor: save_model_state writes the whole model, and each ",
                 "process of a multi-process pipeline holds only its stages: call save_checkpoint on every rank, ",
                 "then `conveyor_checkpoint export OUT FILE...` writes the plain state dict of all the ranks' files");
  save_model_state(path, pipe.state_dict());
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

std::vector<std::pair<std::string, at::Tensor>> Pipeline::named_parameters() const {
  // The stages' own names of the parameters (the Sequential's), which the tie groups use.
  std::vector<std::string> layer_names;
  for (int k = 0; k < runner().num_stages(); ++k) {
    if (!runner().is_local(k)) continue;
    for (const auto& item : runner().stage(k).module()->named_parameters()) layer_names.push_back(item.key());
  }
  const std::set<std::string> local(layer_names.begin(), layer_names.end());
  // A tied weight is listed at its first holder in this process: the
  // pipeline gives the later holders its value (across processes, each
  // process steps its own holder with the summed gradient).
  std::set<std::string> later;
  for (const auto& group : runner().tied_parameters()) {
    bool first = true;
    for (const std::string& name : group) {
      if (!local.count(name)) continue;
      if (!first) later.insert(name);
      first = false;
    }
  }
  const auto named = model_named_parameters(runner());  // in the stages' order, as layer_names
  TORCH_INTERNAL_ASSERT(named.size() == layer_names.size(), "conveyor: a stage's parameters changed names");
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < named.size(); ++i) {
    if (!later.count(layer_names[i])) out.push_back(named[i]);
  }
  return out;
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(std::move(t));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> Pipeline::named_buffers() const {
  return first_of_each(model_named_buffers(runner()));
}

std::vector<std::pair<std::string, at::Tensor>> Pipeline::state_dict() const {
  return first_of_each(state_entries());
}

std::vector<std::pair<std::string, at::Tensor>> Pipeline::state_entries() const {
  for (const ShardedState* shards : local_parameter_shards(runner())) {
    check_argument(shards->parameters_whole(), "conveyor: with shard \"parameters\" each replica holds only its ",
                   "pieces of its stages' weights outside a step, not a state dict; unshard() gathers them (every ",
                   "replica calls it) and reshard() releases them again");
  }
  auto state = model_named_parameters(runner());
  for (auto& b : model_named_buffers(runner())) {
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

Pipeline::IncompatibleKeys Pipeline::load_state_dict(
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
  // With shard "parameters": the loaded weights, sharded.
  for (ShardedState* shards : local_parameter_shards(runner())) shards->shard_parameters();
  return keys;
}

}  // namespace conveyor
