// torch.classes.conveyor.Pipeline: a pipeline over a TorchScript model, driven
// from Python.
//
//   torch.ops.load_library("libconveyor.so")
//   pipe = torch.classes.conveyor.Pipeline(torch.jit.script(model),
//                                          {"workers": 2, "microbatches": 4, "loss": "cross_entropy"})
//   opt = torch.optim.Adam(pipe.parameters(), lr=1e-3)
//   for x, y in batches:
//       opt.zero_grad()
//       loss = pipe.train_step(x, y)
//       opt.step()
//
// The model argument is either the ScriptModule itself (torch.jit.script or
// torch.jit.trace; it arrives as the same TorchScript object, so the
// pipeline trains the caller's module in place) or the path of a file saved
// with torch.jit.save. parameters() returns the model's own tensors, so a
// torch.optim optimizer over them updates the pipeline.
//
// Options (a dict; values may also be given as strings):
//   workers (threads that run the stages; "stages" is refused with a pointer
//   to it), microbatches, schedule, schedule_text, devices (list or
//   comma-separated), split_points (list or comma-separated), balance
//   ("uniform" | "parameters" | "time"), batch_dim, channel_capacity, timeout_ms,
//   optimize (let the TorchScript executor optimize), loss ("cross_entropy"
//   over the last dimension | "mse" | a scripted module called as
//   loss(output, target)), loss_reduction ("mean" | "sum", for a module),
//   fused_ops (swap_fused_ops on the model first: its LSTMs run Conveyor's
//   fused op; fused_ops_report() says which), stage_rng (each stage draws
//   random numbers from its own streams: PipelineOptions::stage_rng),
//   chunks, recompute, offload (PipelineOptions' of those names), sample (an
//   (input, target) batch whose first micro-batch is profiled: needed by
//   balance "time", which splits by measured time; plan() then predicts),
//   optimizer ("sgd" | "adam" | "adamw": the pipeline's own, one per stage,
//   which train_step steps; the asynchronous schedules need it) with lr
//   (required), momentum (sgd) and weight_decay, shared_inputs and
//   shared_targets (indices of inputs or targets that go whole to every
//   micro-batch), tied_parameters (a list of lists of parameter names, as
//   named_parameters() gives them: PipelineOptions::tied_parameters; a
//   tensor the model uses in several stages, as after
//   `self.proj.weight = self.emb.weight`, is tied by itself). Training
//   options (PipelineOptions' of those names; README, "Training options"):
//   autocast ("bf16" | "fp16"), loss_scaling (True, or a dict of
//   init_scale, growth_factor, backoff_factor, growth_interval),
//   clip_grad_norm (a max norm) and clip_norm_type (a number, or "inf"),
//   accumulate_steps; the first three need the pipeline's optimizer.
//
// last_step() returns what the last train_step did: {"loss", "grad_norm",
// "loss_scale", "skipped_updates", "stepped"}; clip_grad_norm(max_norm,
// norm_type) clips for a caller's own optimizer and returns the norm.
//
// train_step and forward take a tensor or a tuple of tensors (a model of
// several inputs; targets likewise); forward returns a tensor, or a tuple
// when the model returns several. The built-in losses read the first output
// and target; a scripted loss module is called as loss(*outputs, *targets).

#include "ops/swap.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/script/python_options.h"
#include "plugin/script/torchscript.h"

#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>
#include <torch/nn/functional/loss.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

namespace conveyor {
namespace {

using Options = PythonOptions;

const std::set<std::string> kKnownOptions = {
    "workers",   "microbatches",     "schedule",   "schedule_text", "devices",     "split_points",   "balance",
    "batch_dim", "channel_capacity", "timeout_ms", "optimize",      "loss",        "loss_reduction", "fused_ops",
    "stage_rng", "optimizer",        "lr",         "momentum",      "weight_decay", "shared_inputs",
    "shared_targets", "tied_parameters", "chunks", "recompute", "offload", "sample", "autocast", "loss_scaling",
    "clip_grad_norm", "clip_norm_type", "accumulate_steps"};

// Bad arguments reach Python as ValueError, failures in a step as RuntimeError.
template <typename Fn>
auto python_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

at::Tensor first_of(const Tensors& tensors, const char* what) {
  TORCH_CHECK_VALUE(!tensors.empty() && tensors[0].defined(), "conveyor.Pipeline: the built-in loss needs a ", what);
  return tensors[0];
}

at::Tensor cross_entropy(const Tensors& outputs, const Tensors& targets) {
  const at::Tensor out = first_of(outputs, "model output"), target = first_of(targets, "target");
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

class PythonPipeline : public torch::CustomClassHolder {
 public:
  PythonPipeline(const c10::IValue& model, const Options& options) {
    python_errors([&] { build(model, options); });
  }

  // One step: accumulates the batch's gradients into parameters()' .grad
  // (zero them first, as with loss.backward()) and returns the loss.
  double train_step(const c10::IValue& input, const c10::IValue& target) {
    return python_errors([&] {
      last_ = pipe_->train_step(as_tensors("input", input), as_tensors("target", target), loss_);
      return last_.loss;
    });
  }

  c10::Dict<std::string, double> last_step() const {
    c10::Dict<std::string, double> out;
    out.insert("loss", last_.loss);
    out.insert("grad_norm", last_.grad_norm);
    out.insert("loss_scale", last_.loss_scale);
    out.insert("skipped_updates", static_cast<double>(last_.skipped_updates));
    out.insert("stepped", last_.stepped ? 1.0 : 0.0);
    return out;
  }

  double clip_grad_norm(double max_norm, double norm_type) {
    return python_errors([&] { return pipe_->clip_grad_norm(max_norm, norm_type); });
  }

  c10::IValue forward(const c10::IValue& input) {
    return python_errors([&]() -> c10::IValue {
      const Tensors out = pipe_->forward(as_tensors("input", input));
      if (out.size() == 1) return out[0];
      std::vector<c10::IValue> items(out.begin(), out.end());
      return c10::ivalue::Tuple::create(std::move(items));
    });
  }

  std::vector<at::Tensor> parameters() const { return pipe_->parameters(); }

  c10::Dict<std::string, at::Tensor> named_parameters() const {
    c10::Dict<std::string, at::Tensor> out;
    for (const auto& [name, p] : model_named_parameters(*pipe_)) out.insert(name, p);
    return out;
  }

  // Detached views of the parameters and buffers, named as in the model.
  c10::Dict<std::string, at::Tensor> state_dict() const {
    c10::Dict<std::string, at::Tensor> out;
    for (const auto& [name, p] : model_named_parameters(*pipe_)) out.insert(name, p.detach());
    for (const auto& [name, b] : model_named_buffers(*pipe_)) out.insert(name, b.detach());
    return out;
  }

  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
    auto tensors = model_named_parameters(*pipe_);
    for (auto& b : model_named_buffers(*pipe_)) tensors.push_back(std::move(b));
    std::set<std::string> names;
    for (const auto& [name, t] : tensors) {
      names.insert(name);
      TORCH_CHECK_VALUE(state.contains(name), "conveyor.Pipeline.load_state_dict: missing '", name, "'");
      TORCH_CHECK_VALUE(state.at(name).sizes().equals(t.sizes()), "conveyor.Pipeline.load_state_dict: '", name,
                        "' has shape ", state.at(name).sizes(), ", the pipeline's has ", t.sizes());
    }
    for (const auto& entry : state) {
      TORCH_CHECK_VALUE(names.count(entry.key()), "conveyor.Pipeline.load_state_dict: unexpected '", entry.key(),
                        "', which the model does not have");
    }
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : tensors) t.copy_(state.at(name));
  }

  void train(bool on) { pipe_->train(on); }
  int64_t num_stages() const { return pipe_->num_stages(); }
  std::string schedule() const { return pipe_->schedule().str(); }
  // The split, and with balance "time" the plan's predicted times and memory.
  std::string plan() const { return plan_text_.empty() ? pipe_->plan().str() : plan_text_; }
  // What the fused_ops option swapped and left (swap_fused_ops' report).
  std::string fused_ops_report() const { return fused_ops_report_; }

  // Weights, buffers, step and random generators; a torch.optim optimizer
  // keeps its own state_dict().
  void save_checkpoint(const std::string& path, int64_t step) const {
    python_errors([&] { conveyor::save_checkpoint(path, *pipe_, TrainingState{step, {}}); });
  }
  int64_t load_checkpoint(const std::string& path) {
    return python_errors([&] { return conveyor::load_checkpoint(path, *pipe_); });
  }

 private:
  void build(const c10::IValue& model, const Options& options) {
    if (model.isString()) {
      model_ = load_script(model.toStringRef());
    } else if (model.isObject() && model.toObjectRef().type()->is_module()) {
      model_ = torch::jit::Module(model.toObject());
    } else {
      throw std::invalid_argument(std::string("conveyor.Pipeline: the model must be a TorchScript module ") +
                                  "(torch.jit.script or torch.jit.trace) or the path of one saved with " +
                                  "torch.jit.save, got " + python_type(model));
    }
    PipelineOptions opts;
    std::vector<std::string> split_points;
    ScriptLayerOptions layer_options;
    bool fused_ops = false;
    std::vector<std::vector<std::string>> tied_by_model_name;
    std::optional<ProfileBatch> sample;
    loss_ = [](const Tensors& out, const Tensors& target) {
      return torch::mse_loss(first_of(out, "model output"), first_of(target, "target"));
    };
    for (const auto& entry : options) {
      const std::string& key = entry.key();
      const c10::IValue& v = entry.value();
      if (key == "stages") {
        throw std::invalid_argument("conveyor.Pipeline: option 'stages' is now 'workers': a stage is a piece of the "
                                    "model, a worker the thread that runs one or more stages");
      }
      if (!kKnownOptions.count(key)) {
        std::string known;
        for (const auto& k : kKnownOptions) known += (known.empty() ? "" : ", ") + k;
        throw std::invalid_argument("conveyor.Pipeline: unknown option '" + key + "' (known: " + known + ")");
      }
      if (key == "workers") opts.workers(static_cast<int>(as_int(key, v)));
      if (key == "microbatches") opts.microbatches(static_cast<int>(as_int(key, v)));
      if (key == "schedule") opts.schedule(as_string(key, v));
      if (key == "schedule_text") opts.schedule_text(as_string(key, v));
      if (key == "devices") opts.devices(as_strings(key, v));
      if (key == "split_points") split_points = as_strings(key, v);
      if (key == "batch_dim") opts.batch_dim(as_int(key, v));
      if (key == "channel_capacity") opts.channel_capacity(static_cast<int>(as_int(key, v)));
      if (key == "timeout_ms") opts.timeout(std::chrono::milliseconds(as_int(key, v)));
      if (key == "optimize") layer_options.optimize = as_bool(key, v);
      if (key == "stage_rng") opts.stage_rng(as_bool(key, v));
      if (key == "chunks") opts.chunks(static_cast<int>(as_int(key, v)));
      if (key == "recompute") opts.recompute(as_bool(key, v));
      if (key == "offload") opts.offload(as_bool(key, v));
      if (key == "autocast") {
        const std::string d = as_string(key, v);
        if (d == "bf16" || d == "bfloat16") {
          opts.autocast(at::kBFloat16);
        } else if (d == "fp16" || d == "float16" || d == "half") {
          opts.autocast(at::kHalf);
        } else {
          throw bad_option(key, "\"bf16\" or \"fp16\"", v);
        }
      }
      if (key == "loss_scaling") set_loss_scaling(v, opts);
      if (key == "clip_grad_norm") opts.clip_grad_norm(as_double(key, v));
      if (key == "clip_norm_type") {
        const bool inf = v.isString() && (v.toStringRef() == "inf" || v.toStringRef() == "infinity");
        opts.clip_norm_type(inf ? std::numeric_limits<double>::infinity() : as_double(key, v));
      }
      if (key == "accumulate_steps") opts.accumulate_steps(static_cast<int>(as_int(key, v)));
      if (key == "balance") {
        const std::string b = as_string(key, v);
        if (b != "uniform" && b != "parameters" && b != "time") {
          throw bad_option(key, "\"uniform\", \"parameters\" or \"time\"", v);
        }
        opts.balance(b == "uniform" ? Balance::kUniform : b == "time" ? Balance::kTime : Balance::kParameters);
      }
      if (key == "sample") {
        if (!v.isTuple() || v.toTupleRef().elements().size() != 2) {
          throw bad_option(key, "an (input, target) tuple, each a tensor or a tuple of tensors", v);
        }
        sample = ProfileBatch{as_tensors("sample input", v.toTupleRef().elements()[0]),
                              as_tensors("sample target", v.toTupleRef().elements()[1]), nullptr};
      }
      if (key == "loss_reduction") {
        const std::string r = as_string(key, v);
        if (r != "mean" && r != "sum") throw bad_option(key, "\"mean\" or \"sum\"", v);
        opts.loss_reduction(r == "mean" ? LossReduction::kMean : LossReduction::kSum);
      }
      if (key == "loss") set_loss(v);
      if (key == "fused_ops") fused_ops = as_bool(key, v);
      if (key == "shared_inputs") opts.shared_inputs(as_ints(key, v));
      if (key == "shared_targets") opts.shared_targets(as_ints(key, v));
      if (key == "tied_parameters") {
        if (!v.isList()) throw bad_option(key, "a list of lists of parameter names", v);
        std::vector<std::vector<std::string>> groups;
        for (const c10::IValue& group : v.toListRef()) groups.push_back(as_strings(key, group));
        tied_by_model_name = std::move(groups);
      }
    }
    opts.optimizer(optimizer_from(options));
    if (fused_ops) fused_ops_report_ = swap_fused_ops(model_).to_string();
    if (sample) sample->loss = loss_;
    pipe_ = make_script_pipeline(model_, opts, split_points, layer_options, tied_by_model_name,
                                 sample ? &*sample : nullptr, &plan_text_);
  }

  static void set_loss_scaling(const c10::IValue& v, PipelineOptions& opts) {
    const std::string key = "loss_scaling";
    if (v.isBool()) {
      if (v.toBool()) opts.loss_scaling(LossScaling());
      return;
    }
    if (!v.isGenericDict()) throw bad_option(key, "True, or a dict of init_scale, growth_factor, backoff_factor, growth_interval", v);
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
    opts.loss_scaling(scaling);
  }

  void set_loss(const c10::IValue& v) {
    if (v.isString()) {
      const std::string name = v.toStringRef();
      if (name == "mse") return;  // the default
      if (name == "cross_entropy") {
        loss_ = cross_entropy;
        return;
      }
    } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
      torch::jit::Module module(v.toObject());
      loss_ = [module](const Tensors& outputs, const Tensors& targets) mutable {
        std::vector<c10::IValue> args(outputs.begin(), outputs.end());
        args.insert(args.end(), targets.begin(), targets.end());
        return module.forward(std::move(args)).toTensor();
      };
      return;
    }
    throw bad_option("loss", "\"cross_entropy\", \"mse\" or a scripted module", v);
  }

  torch::jit::Module model_;
  std::string fused_ops_report_ = "fused_ops is off\n";
  std::string plan_text_;
  std::unique_ptr<Pipeline> pipe_;
  StepResult last_;  // the last train_step's
  TensorsLossFn loss_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  m.class_<PythonPipeline>("Pipeline")
      .def(torch::init<c10::IValue, Options>())
      .def("train_step", &PythonPipeline::train_step)
      .def("last_step", &PythonPipeline::last_step)
      .def("clip_grad_norm", &PythonPipeline::clip_grad_norm)
      .def("forward", &PythonPipeline::forward)
      .def("parameters", &PythonPipeline::parameters)
      .def("named_parameters", &PythonPipeline::named_parameters)
      .def("state_dict", &PythonPipeline::state_dict)
      .def("load_state_dict", &PythonPipeline::load_state_dict)
      .def("train", &PythonPipeline::train)
      .def("num_stages", &PythonPipeline::num_stages)
      .def("schedule", &PythonPipeline::schedule)
      .def("plan", &PythonPipeline::plan)
      .def("fused_ops_report", &PythonPipeline::fused_ops_report)
      .def("save_checkpoint", &PythonPipeline::save_checkpoint)
      .def("load_checkpoint", &PythonPipeline::load_checkpoint);
}

}  // namespace conveyor
