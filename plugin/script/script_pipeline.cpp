#include "plugin/script/script_pipeline.h"

#include "ops/swap.h"
#include "plugin/errors.h"
#include "plugin/model_names.h"
#include "plugin/script/build_options.h"
#include "plugin/script/python_options.h"
#include "plugin/planner/search.h"
#include "plugin/script/torchscript.h"
#include "plugin/tune_plan.h"
#ifdef CONVEYOR_WITH_EXPORT
#include "plugin/export/exported.h"
#endif

#include <c10/util/StringUtil.h>
#include <torch/nn/functional/loss.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

namespace conveyor {

namespace {

at::Tensor first_of(const Tensors& tensors, const char* what) {
  check_argument(!tensors.empty() && tensors[0].defined(), "conveyor.Pipeline: the built-in loss needs a ", what);
  return tensors[0];
}

at::Tensor mse(const Tensors& outputs, const Tensors& targets) {
  return torch::mse_loss(first_of(outputs, "model output"), first_of(targets, "target"));
}

at::Tensor cross_entropy(const Tensors& outputs, const Tensors& targets) {
  const at::Tensor out = first_of(outputs, "model output"), target = first_of(targets, "target");
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

TensorsLossFn loss_from(const c10::IValue& v) {
  if (v.isString()) {
    if (v.toStringRef() == "mse") return mse;
    if (v.toStringRef() == "cross_entropy") return cross_entropy;
  } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
    torch::jit::Module module(v.toObject());
    return [module](const Tensors& outputs, const Tensors& targets) mutable {
      std::vector<c10::IValue> args(outputs.begin(), outputs.end());
      args.insert(args.end(), targets.begin(), targets.end());
      return module.forward(std::move(args)).toTensor();
    };
  }
  throw bad_option("loss", "\"cross_entropy\", \"mse\" or a scripted module", v);
}

}  // namespace

const std::set<std::string>& script_pipeline_options() {
  static const std::set<std::string> known = [] {
    std::set<std::string> out = {"loss", "sample"};
    for (const OptionDescription& row : every_option()) {
      if (!row.type.empty()) out.insert(row.name);
    }
    return out;
  }();
  return known;
}

ScriptPipeline::ScriptPipeline(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
                               std::shared_ptr<ProcessGroups> groups, ValueText text) {
  build(model, options, customize, std::move(groups), text);
}

void ScriptPipeline::build(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
                           std::shared_ptr<ProcessGroups> groups, ValueText text) {
  bool exported_model = false;
#ifdef CONVEYOR_WITH_EXPORT
  std::optional<ExportedModel> exported;
  if (model.isString() && holds_exported_program(model.toStringRef())) {
    exported = load_exported(model.toStringRef());
    exported_model = true;
  } else
#endif
  if (model.isString()) {
    model_ = load_script(model.toStringRef());
  } else if (model.isObject() && model.toObjectRef().type()->is_module()) {
    model_ = torch::jit::Module(model.toObject());
  } else {
    throw std::invalid_argument(std::string("conveyor.Pipeline: the model must be a TorchScript module ") +
                                "(torch.jit.script or torch.jit.trace), the path of one saved with " +
                                "torch.jit.save, or the path of a torch.export program (.pt2), got " +
                                python_type(model));
  }
  PipelineOptions opts;
  std::optional<ProfileBatch> sample;
  loss_ = mse;
  for (const auto& entry : options) {
    const std::string& key = entry.key();
    const c10::IValue& v = entry.value();
    if (key == "stages") {
      throw std::invalid_argument("conveyor.Pipeline: option 'stages' is now 'workers': a stage is a piece of the "
                                  "model, a worker the thread that runs one or more stages");
    }
    if (key == "loss") {
      loss_ = loss_from(v);
    } else if (key == "sample") {
      if (!v.isTuple() || v.toTupleRef().elements().size() != 2) {
        throw bad_type(key, "an (input, target) tuple, each a tensor or a tuple of tensors", v);
      }
      sample = ProfileBatch{as_tensors("sample input", v.toTupleRef().elements()[0]),
                            as_tensors("sample target", v.toTupleRef().elements()[1]), nullptr};
    } else if (!read_option(opts, key, v, text) && !read_option(build_, key, v, text) &&
               !read_option(distributed_options_, key, v, text)) {
      throw std::invalid_argument("conveyor.Pipeline: unknown option '" + key + "' (known: " +
                                  c10::Join(", ", script_pipeline_options()) + ")");
    }
  }
  check_bounds(opts);
  check_bounds(build_);
  check_bounds(distributed_options_);
  const std::vector<std::string>& split_points = build_.split_points();
  const std::vector<std::vector<std::string>> tied_by_model_name = std::move(opts.tied_parameters());
  opts.tied_parameters({});
  ScriptLayerOptions layer_options;
  layer_options.optimize = build_.optimize();
  const bool auto_plan = build_.plan() != PlanMode::kGiven, tuned_plan = build_.plan() == PlanMode::kTuned;
  PlanSpace space;
  space.max_workers = build_.max_workers();
  space.memory_budget = build_.memory_budget();
  opts.optimizer(optimizer_from(build_));
  if (customize) customize(opts, loss_);
  if (build_.fused_ops()) {
    check_argument(!exported_model, "conveyor.Pipeline: fused_ops swaps TorchScript submodules; a torch.export ",
                   "program runs the operators it was exported with");
    fused_ops_report_ = swap_fused_ops(model_).to_string();
  }
  if (sample) sample->loss = loss_;
  if (groups && opts.balance() == Balance::kTime && split_points.empty() && opts.boundaries().empty()) {
    throw std::invalid_argument("conveyor.Pipeline: balance \"time\" across processes would let each process "
                                "measure its own times and perhaps cut the model elsewhere: give split_points, "
                                "or balance \"uniform\" or \"parameters\"");
  }
  // The sample's size along batch_dim, as its first split input has it.
  int64_t batch = 0;
  for (size_t i = 0; sample && i < sample->inputs.size() && batch == 0; ++i) {
    const at::Tensor& t = sample->inputs[i];
    const auto& shared = opts.shared_inputs();
    const bool whole = std::find(shared.begin(), shared.end(), static_cast<int64_t>(i)) != shared.end();
    if (t.defined() && !whole && t.dim() > opts.batch_dim()) batch = t.size(opts.batch_dim());
  }
  if (auto_plan) {
    check_argument(split_points.empty() && opts.boundaries().empty(),
                   "conveyor.Pipeline: plan \"auto\" chooses where to cut: give no split_points");
    check_argument(sample.has_value(), "conveyor.Pipeline: plan \"auto\" profiles the model: give sample=(inputs, ",
                   "target), a batch of the size each step trains on");
    check_argument(!groups, "conveyor.Pipeline: plan \"auto\" searches in one process (each process would measure ",
                   "its own times and might choose another plan): search in one, then pass its choices to all");
    opts.balance(Balance::kTime);
    if (space.max_workers == 0) space.max_workers = opts.workers() > 0 ? opts.workers() : 4;
  } else {
    check_argument(space.max_workers == 0 && space.memory_budget == 0,
                   "conveyor.Pipeline: max_workers and memory_budget bound the search of plan=\"auto\"");
  }
  // One worker per process: the pipeline group's size is the number of workers.
  if (groups && opts.workers() == 0) opts.workers(groups->layout().workers);
#ifdef CONVEYOR_WITH_EXPORT
  FrontEndStages stages =
      exported ? export_stages(*exported, opts, split_points, tied_by_model_name, sample ? &*sample : nullptr)
               : script_stages(model_, opts, split_points, layer_options, tied_by_model_name,
                               sample ? &*sample : nullptr);
#else
  FrontEndStages stages =
      script_stages(model_, opts, split_points, layer_options, tied_by_model_name, sample ? &*sample : nullptr);
#endif
  if (auto_plan) {
    const PlanSearch search = search_plans(stages.layers, stages.options, batch, space);
    search_text_ = search.str();
    if (tuned_plan) {  // the first plans timed on the sample
      check_argument(static_cast<bool>(loss_), "conveyor.Pipeline: plan \"tuned\" trains on the sample: give loss_fn");
      const PlanTuning tuning = tune_plan(stages.layers, search, stages.options, sample->inputs, sample->targets, loss_);
      search_text_ += tuning.str();
      stages.options = tuning.best().options(std::move(stages.options));
    } else {
      stages.options = search.best().options(std::move(stages.options));
    }
  }
  if (groups) {
    distributed_ = std::make_unique<DistributedPipeline>(stages.layers, std::move(stages.options), std::move(groups),
                                                         distributed_options_);
    pipe_ = &distributed_->pipeline();
  } else {
    local_ = std::make_unique<Pipeline>(stages.layers, std::move(stages.options));
    pipe_ = local_.get();
  }
  if (const auto& profile = pipe_->options().profile(); profile && sample) {
    plan_ = predict(*profile, pipe_->plan(), pipe_->schedule(), batch, pipe_->options());
    plan_->balance = auto_plan ? "searched" : split_points.empty() && opts.boundaries().empty() ? "time"
                                                                                               : "given boundaries";
  }
}

const StepResult& ScriptPipeline::train_step(const Tensors& inputs, const Tensors& targets) {
  last_ = distributed_ ? distributed_->train_step(inputs, targets, loss_) : pipe_->train_step(inputs, targets, loss_);
  return last_;
}

Tensors ScriptPipeline::forward(const Tensors& inputs) {
  return distributed_ ? distributed_->forward(inputs) : pipe_->forward(inputs);
}

double ScriptPipeline::clip_grad_norm(double max_norm, double norm_type) {
  return distributed_ ? distributed_->clip_grad_norm(max_norm, norm_type) : pipe_->clip_grad_norm(max_norm, norm_type);
}

std::vector<std::pair<std::string, at::Tensor>> ScriptPipeline::named_parameters() const {
  return model_named_parameters(*pipe_);
}

std::vector<std::pair<std::string, at::Tensor>> ScriptPipeline::named_buffers() const {
  return model_named_buffers(*pipe_);
}

std::vector<std::pair<std::string, at::Tensor>> ScriptPipeline::state_dict() const {
  auto state = named_parameters();
  for (auto& b : named_buffers()) state.push_back(std::move(b));
  for (auto& [name, t] : state) t = t.detach();
  return state;
}

ScriptPipeline::IncompatibleKeys ScriptPipeline::load_state_dict(
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
