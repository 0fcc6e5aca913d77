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
// Options: a dict, its values of the documented types or strings of them;
// plugin/builder/dict_options.h lists and reads them (the conveyor Python
// package reads the same, as typed keywords). Python users who do not write
// TorchScript reach Conveyor through that package (docs/guides/python.md, "Train an
// nn.Module from Python"); this class stays for TorchScript code.
//
// last_step() returns what the last train_step did: {"loss", "grad_norm",
// "loss_scale", "skipped_updates", "stepped"}; clip_grad_norm(max_norm,
// norm_type) clips for a caller's own optimizer and returns the norm.
//
// train_step and forward take a tensor or a tuple of tensors (a model of
// several inputs; targets likewise); forward returns a tensor, or a tuple
// when the model returns several. The built-in losses read the first output
// and target; a scripted loss module is called as loss(*outputs, *targets).

#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/model_state.h"
#include "plugin/pipeline.h"
#include "plugin/builder/dict_options.h"

#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <stdexcept>

namespace conveyor {
namespace {

// Bad arguments reach Python as ValueError, failures in a step as RuntimeError.
template <typename Fn>
auto python_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

c10::Dict<std::string, at::Tensor> as_dict(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  c10::Dict<std::string, at::Tensor> out;
  for (const auto& [name, t] : named) out.insert(name, t);
  return out;
}

class PythonPipeline : public torch::CustomClassHolder {
 public:
  PythonPipeline(const c10::IValue& model, const PythonOptions& options) {
    python_errors([&] {
      pipe_ = std::make_unique<Pipeline>(model_from_value(model), request_from_dict(options, ValueText::kOrText));
    });
  }

  // One step: accumulates the batch's gradients into parameters()' .grad
  // (zero them first, as with loss.backward()) and returns the loss.
  double train_step(const c10::IValue& input, const c10::IValue& target) {
    return python_errors(
        [&] { return pipe_->train_step(as_tensors("input", input), as_tensors("target", target)).loss; });
  }

  c10::Dict<std::string, double> last_step() const {
    const StepResult& last = pipe_->last_step();
    c10::Dict<std::string, double> out;
    out.insert("loss", last.loss);
    out.insert("grad_norm", last.grad_norm);
    out.insert("loss_scale", last.loss_scale);
    out.insert("skipped_updates", static_cast<double>(last.skipped_updates));
    out.insert("stepped", last.stepped ? 1.0 : 0.0);
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
  c10::Dict<std::string, at::Tensor> named_parameters() const { return as_dict(pipe_->named_parameters()); }

  // Detached views of the parameters and buffers, named as in the model.
  c10::Dict<std::string, at::Tensor> state_dict() const {
    return as_dict(pipe_->state_dict());
  }

  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& entry : state) named.emplace_back(entry.key(), entry.value());
    python_errors([&] { pipe_->load_state_dict(named); });
  }

  void train(bool on) { pipe_->train(on); }
  int64_t num_stages() const { return pipe_->num_stages(); }
  std::string schedule() const { return pipe_->schedule().str(); }
  // The split, and with balance "time" the plan's predicted times and memory.
  std::string plan() const { return pipe_->plan_text(); }
  // What the fused_ops option swapped and left (swap_fused_ops' report).
  std::string fused_ops_report() const { return pipe_->fused_ops_report(); }

  // Weights, buffers, step and random generators; a torch.optim optimizer
  // keeps its own state_dict().
  void save_checkpoint(const std::string& path, int64_t step) const {
    python_errors([&] { conveyor::save_checkpoint(path, *pipe_, TrainingState{step, {}}); });
  }
  int64_t load_checkpoint(const std::string& path) {
    return python_errors([&] { return conveyor::load_checkpoint(path, *pipe_); });
  }
  // The plain state dict ({name: tensor}), which torch.load reads.
  void save_model_state(const std::string& path) const {
    python_errors([&] { conveyor::save_model_state(path, *pipe_); });
  }

 private:
  std::unique_ptr<Pipeline> pipe_;
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  m.class_<PythonPipeline>("Pipeline")
      .def(torch::init<c10::IValue, PythonOptions>())
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
      .def("save_model_state", &PythonPipeline::save_model_state)
      .def("load_checkpoint", &PythonPipeline::load_checkpoint);
}

}  // namespace conveyor
