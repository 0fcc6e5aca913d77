#include "plugin/script/script_pipeline.h"

#include "ops/swap.h"
#include "plugin/errors.h"
#include "plugin/model_names.h"
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

LossScaling loss_scaling_from(const c10::IValue& v) {
  const std::string key = "loss_scaling";
  if (!v.isGenericDict()) {
    throw bad_option(key, "True, or a dict of init_scale, growth_factor, backoff_factor, growth_interval", v);
  }
  LossScaling scaling;
  for (const auto& entry : v.toGenericDict()) {
    const std::string field = entry.key().isString() ? entry.key().toStringRef() : "";
    const c10::IValue& value = entry.value();
    if (field == "init_scale") {
      scaling.init_scale(as_double(key + "." + field, value));
    } else if (field == "growth_factor") {
      scaling.growth_factor(as_double(key + "." + field, value));
    } else if (field == "backoff_factor") {
      scaling.backoff_factor(as_double(key + "." + field, value));
    } else if (field == "growth_interval") {
      // A dict of numbers arrives with one value type: 2000.0 is 2000 updates.
      const double interval = value.isInt() ? static_cast<double>(value.toInt()) : as_double(key + "." + field, value);
      if (interval != std::floor(interval)) throw bad_option(key + "." + field, "a whole number of updates", value);
      scaling.growth_interval(static_cast<int64_t>(interval));
    } else {
      throw std::invalid_argument("conveyor.Pipeline: unknown loss_scaling field '" + field +
                                  "' (known: init_scale, growth_factor, backoff_factor, growth_interval)");
    }
  }
  return scaling;
}

// One option into `opts` (or the front end's own settings); false if `key` is not a PipelineOptions field.
bool set_pipeline_option(const std::string& key, const c10::IValue& v, PipelineOptions& opts) {
  const auto as_count = [&] { return static_cast<int>(as_int(key, v)); };
  if (key == "workers") {
    opts.workers(as_count());
  } else if (key == "microbatches") {
    opts.microbatches(as_count());
  } else if (key == "schedule") {
    opts.schedule(as_string(key, v));
  } else if (key == "schedule_text") {
    opts.schedule_text(as_string(key, v));
  } else if (key == "devices") {
    opts.devices(as_strings(key, v));
  } else if (key == "batch_dim") {
    opts.batch_dim(as_int(key, v));
  } else if (key == "channel_capacity") {
    opts.channel_capacity(as_count());
  } else if (key == "timeout_ms") {
    opts.timeout(std::chrono::milliseconds(as_int(key, v)));
  } else if (key == "stage_rng") {
    opts.stage_rng(as_bool(key, v));
  } else if (key == "chunks") {
    opts.chunks(as_count());
  } else if (key == "lookahead") {
    opts.lookahead(as_count());
  } else if (key == "recompute") {
    opts.recompute(as_bool(key, v));
  } else if (key == "offload") {
    opts.offload(as_bool(key, v));
  } else if (key == "vertical_sync") {
    opts.vertical_sync(as_bool(key, v));
  } else if (key == "trace") {
    opts.trace(as_bool(key, v));
  } else if (key == "divergence_guard") {
    opts.divergence_guard(as_bool(key, v));
  } else if (key == "free_sent_activations") {
    opts.free_sent_activations(as_bool(key, v));
  } else if (key == "shared_inputs") {
    opts.shared_inputs(as_ints(key, v));
  } else if (key == "shared_targets") {
    opts.shared_targets(as_ints(key, v));
  } else if (key == "clip_grad_norm") {
    opts.clip_grad_norm(as_double(key, v));
  } else if (key == "accumulate_steps") {
    opts.accumulate_steps(as_count());
  } else if (key == "clip_norm_type") {
    const bool inf = v.isString() && (v.toStringRef() == "inf" || v.toStringRef() == "infinity");
    opts.clip_norm_type(inf ? std::numeric_limits<double>::infinity() : as_double(key, v));
  } else if (key == "loss_scaling") {
    if (!v.isBool()) {
      opts.loss_scaling(loss_scaling_from(v));
    } else if (v.toBool()) {
      opts.loss_scaling(LossScaling());
    }
  } else if (key == "autocast") {
    const std::string d = as_string(key, v);
    if (d == "bf16" || d == "bfloat16") {
      opts.autocast(at::kBFloat16);
    } else if (d == "fp16" || d == "float16" || d == "half") {
      opts.autocast(at::kHalf);
    } else {
      throw bad_option(key, "\"bf16\" or \"fp16\"", v);
    }
  } else if (key == "balance") {
    const std::string b = as_string(key, v);
    if (b != "uniform" && b != "parameters" && b != "time") {
      throw bad_option(key, "\"uniform\", \"parameters\" or \"time\"", v);
    }
    opts.balance(b == "uniform" ? Balance::kUniform : b == "time" ? Balance::kTime : Balance::kParameters);
  } else if (key == "loss_reduction") {
    const std::string r = as_string(key, v);
    if (r != "mean" && r != "sum") throw bad_option(key, "\"mean\" or \"sum\"", v);
    opts.loss_reduction(r == "mean" ? LossReduction::kMean : LossReduction::kSum);
  } else if (key == "lr_schedule_unit") {
    const std::string u = as_string(key, v);
    if (u != "batch" && u != "microbatch") throw bad_option(key, "\"batch\" or \"microbatch\"", v);
    opts.lr_schedule_unit(u == "batch" ? UpdateUnit::kBatch : UpdateUnit::kMicrobatch);
  } else {
    return false;
  }
  return true;
}

}  // namespace

const std::set<std::string>& script_pipeline_options() {
  static const std::set<std::string> known = {
      "workers",        "microbatches",   "schedule",      "schedule_text",    "devices",        "split_points",
      "balance",        "batch_dim",      "channel_capacity", "timeout_ms",    "optimize",       "loss",
      "loss_reduction", "fused_ops",      "stage_rng",     "optimizer",        "lr",             "momentum",
      "weight_decay",   "shared_inputs",  "shared_targets", "tied_parameters", "chunks",         "recompute",
      "offload",        "vertical_sync",  "trace",         "divergence_guard", "sample",         "autocast",
      "loss_scaling",   "clip_grad_norm", "clip_norm_type", "accumulate_steps", "lr_schedule_unit", "plan",
      "max_workers",    "memory_budget",  "lookahead",     "free_sent_activations"};
  return known;
}

ScriptPipeline::ScriptPipeline(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
                               std::shared_ptr<ProcessGroups> groups, DistributedOptions distributed) {
  build(model, options, customize, std::move(groups), std::move(distributed));
}

void ScriptPipeline::build(const c10::IValue& model, const ScriptOptions& options, const Customize& customize,
                           std::shared_ptr<ProcessGroups> groups, DistributedOptions distributed) {
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
  std::vector<std::string> split_points;
  ScriptLayerOptions layer_options;
  bool fused_ops = false;
  std::vector<std::vector<std::string>> tied_by_model_name;
  std::optional<ProfileBatch> sample;
  bool auto_plan = false, tuned_plan = false;
  PlanSpace space;
  loss_ = mse;
  for (const auto& entry : options) {
    const std::string& key = entry.key();
    const c10::IValue& v = entry.value();
    if (key == "stages") {
      throw std::invalid_argument("conveyor.Pipeline: option 'stages' is now 'workers': a stage is a piece of the "
                                  "model, a worker the thread that runs one or more stages");
    }
    if (!script_pipeline_options().count(key)) {
      throw std::invalid_argument("conveyor.Pipeline: unknown option '" + key + "' (known: " +
                                  c10::Join(", ", script_pipeline_options()) + ")");
    }
    if (set_pipeline_option(key, v, opts)) continue;
    if (key == "split_points") split_points = as_strings(key, v);
    if (key == "optimize") layer_options.optimize = as_bool(key, v);
    if (key == "loss") loss_ = loss_from(v);
    if (key == "fused_ops") fused_ops = as_bool(key, v);
    if (key == "plan") {
      const std::string plan = as_string(key, v);
      if (plan != "auto" && plan != "tuned") throw bad_option(key, "\"auto\" or \"tuned\"", v);
      auto_plan = true;
      tuned_plan = plan == "tuned";
    }
    if (key == "max_workers") space.max_workers = static_cast<int>(as_int(key, v));
    if (key == "memory_budget") space.memory_budget = as_int(key, v);
    if (key == "sample") {
      if (!v.isTuple() || v.toTupleRef().elements().size() != 2) {
        throw bad_option(key, "an (input, target) tuple, each a tensor or a tuple of tensors", v);
      }
      sample = ProfileBatch{as_tensors("sample input", v.toTupleRef().elements()[0]),
                            as_tensors("sample target", v.toTupleRef().elements()[1]), nullptr};
    }
    if (key == "tied_parameters") {
      if (!v.isList()) throw bad_option(key, "a list of lists of parameter names", v);
      for (const c10::IValue& group : v.toListRef()) tied_by_model_name.push_back(as_strings(key, group));
    }
  }
  opts.optimizer(optimizer_from(options));
  if (customize) customize(opts, loss_);
  if (fused_ops) {
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
                                                         std::move(distributed));
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

void ScriptPipeline::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  auto tensors = named_parameters();
  for (auto& b : named_buffers()) tensors.push_back(std::move(b));
  const std::map<std::string, at::Tensor> given(state.begin(), state.end());
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    names.insert(name);
    const auto it = given.find(name);
    check_argument(it != given.end(), "conveyor.Pipeline.load_state_dict: missing '", name, "'");
    check_argument(it->second.sizes().equals(t.sizes()), "conveyor.Pipeline.load_state_dict: '", name,
                   "' has shape ", it->second.sizes(), ", the pipeline's has ", t.sizes());
  }
  for (const auto& [name, value] : given) {
    check_argument(names.count(name) > 0, "conveyor.Pipeline.load_state_dict: unexpected '", name,
                   "', which the model does not have");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors) t.copy_(given.at(name));
}

}  // namespace conveyor
