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
// The class is conveyor::PipelineBinding (binding.h says what each method
// does), the one the conveyor package's _C.Pipeline holds too. train_step
// and forward take a tensor or a tuple of tensors (a model of several
// inputs; targets likewise). The built-in losses read the first output and
// target; a scripted loss module is called as loss(*outputs, *targets).

#include "plugin/builder/binding.h"
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

// A method of the binding as TorchScript calls it, its errors as above.
template <auto Method>
struct Guarded;
template <typename R, typename... A, R (PipelineBinding::*Method)(A...)>
struct Guarded<Method> {
  static R call(const c10::intrusive_ptr<PipelineBinding>& self, A... args) {
    return python_errors([&]() -> R { return ((*self).*Method)(args...); });
  }
};
template <typename R, typename... A, R (PipelineBinding::*Method)(A...) const>
struct Guarded<Method> {
  static R call(const c10::intrusive_ptr<PipelineBinding>& self, A... args) {
    return python_errors([&]() -> R { return ((*self).*Method)(args...); });
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  m.class_<PipelineBinding>("Pipeline")
      .def(torch::init([](const c10::IValue& model, const PythonOptions& options) {
        return python_errors([&] {
          return c10::make_intrusive<PipelineBinding>(
              std::make_unique<Pipeline>(model_from_value(model), request_from_dict(options, ValueText::kOrText)));
        });
      }))
      .def("train_step", &Guarded<&PipelineBinding::train_step>::call)
      .def("last_step", &Guarded<&PipelineBinding::last_step>::call)
      .def("clip_grad_norm", &Guarded<&PipelineBinding::clip_grad_norm>::call)
      .def("forward", &Guarded<&PipelineBinding::forward>::call)
      .def("parameters", &Guarded<&PipelineBinding::parameters>::call)
      .def("named_parameters", &Guarded<&PipelineBinding::named_parameters>::call)
      .def("state_dict", &Guarded<&PipelineBinding::state_dict>::call)
      .def("load_state_dict", &Guarded<&PipelineBinding::load_state_dict>::call)
      .def("train", &Guarded<&PipelineBinding::train>::call)
      .def("num_stages", &Guarded<&PipelineBinding::num_stages>::call)
      .def("schedule", &Guarded<&PipelineBinding::schedule>::call)
      .def("plan", &Guarded<&PipelineBinding::plan>::call)
      .def("fused_ops_report", &Guarded<&PipelineBinding::fused_ops_report>::call)
      .def("save_checkpoint", &Guarded<&PipelineBinding::save_checkpoint>::call)
      .def("save_model_state", &Guarded<&PipelineBinding::save_model_state>::call)
      .def("load_checkpoint", &Guarded<&PipelineBinding::load_checkpoint>::call);
}

}  // namespace conveyor
