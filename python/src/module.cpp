// conveyor._C: the extension module behind the `conveyor` Python package
// (python/conveyor/). Its Pipeline holds the one binding of
// conveyor::Pipeline (plugin/builder/binding.h, which TorchScript holds as
// torch.classes.conveyor.Pipeline) and adds what only Python has: a loss function and a learning-rate schedule
// that are Python callables, called on the pipeline's threads with the GIL
// taken for the call alone (train_step and forward release it while the
// stages run), and errors raised as the Python exceptions they are.

#include "plugin/core/errors.h"
#ifdef CONVEYOR_WITH_EXPORT
#include "plugin/export/exported.h"
#endif
#include "plugin/distributed/distributed_runner.h"
#include "plugin/pipeline.h"
#include "plugin/builder/binding.h"
#include "plugin/builder/dict_options.h"
#include "plugin/builder/front_end.h"
#include "plugin/builder/option_table.h"
#include "plugin/core/option_values.h"
#include "plugin/trace/timeline.h"
#include "plugin/version.h"
#include "python/src/process_groups.h"
#include "python/src/options_module.h"
#include "python/src/schedules_module.h"
#include "python/src/values.h"

#include <torch/extension.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace conveyor {
namespace {

// A Python object held by C++ code that any thread may copy or drop: the
// last owner takes the GIL to release it.
std::shared_ptr<py::object> hold(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// The first Python exception a callback raised inside a step, kept to be
// raised again in the caller's thread once the step has unwound.
struct RaisedInStep {
  std::mutex mutex;
  std::optional<py::error_already_set> error;

  void keep(py::error_already_set&& e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = std::move(e);
  }
  std::optional<py::error_already_set> take() {
    std::lock_guard<std::mutex> lock(mutex);
    auto out = std::move(error);
    error.reset();
    return out;
  }
};

// Calls `fn` with the GIL; a Python exception is kept in `raised` and the
// step fails with its message (the runtime names stage and micro-batch).
template <typename Fn>
auto call_python(const std::shared_ptr<RaisedInStep>& raised, const char* what, Fn&& fn) -> decltype(fn()) {
  py::gil_scoped_acquire gil;
  try {
    return fn();
  } catch (py::error_already_set& e) {
    const std::string message = std::string(what) + " raised " + e.what();
    raised->keep(std::move(e));
    throw std::runtime_error(message);
  }
}

TensorsLossFn python_loss(py::object fn, std::shared_ptr<RaisedInStep> raised) {
  auto callable = hold(std::move(fn));
  return [callable, raised](const Tensors& outputs, const Tensors& targets) {
    return call_python(raised, "loss_fn", [&] {
      const py::object loss = (*callable)(python_tensors(outputs), python_tensors(targets));
      if (!THPVariable_Check(loss.ptr())) {
        const std::string got = py::str(py::type::handle_of(loss).attr("__name__"));
        PyErr_SetString(PyExc_TypeError, ("conveyor.Pipeline: loss_fn must return a scalar tensor, got " + got).c_str());
        throw py::error_already_set();
      }
      return loss.cast<at::Tensor>();
    });
  };
}

LearningRateSchedule python_lr_schedule(py::object fn, std::shared_ptr<RaisedInStep> raised) {
  auto callable = hold(std::move(fn));
  return [callable, raised](int64_t update) {
    return call_python(raised, "lr_schedule", [&] { return (*callable)(update).cast<double>(); });
  };
}

// A step's result with the plan's prediction (when the plan made one), for
// pictures of predicted against measured.
struct StepReport : StepResult {
  std::shared_ptr<const Prediction> prediction;

  std::vector<TimelineBlock> timeline() const {
    std::vector<TimelineBlock> blocks;
    if (prediction) blocks.push_back(timeline_block(prediction->simulation, "predicted"));
    blocks.push_back(timeline_block(*this, "measured"));
    return blocks;
  }
};


class PyPipeline {
 public:
  // `checked`: the keywords' options (plugin/builder/dict_options.h), parsed
  // and checked once by check_options when conveyor.Pipeline was made;
  // `loss_fn` and `lr_schedule`: Python callables or None. `process_group`
  // (None for one process) and `replica_group`: torch.distributed's groups,
  // see process_groups().
  //
  // `model`: a ScriptModule's C++ module, or the path of a TorchScript file
  // or torch.export archive. `tensors`: for an archive, the exported
  // module's own parameters and buffers as (name, tensor) in its order,
  // which the pipeline then trains in place of the archive's copies.
  PyPipeline(const py::object& model, const CheckedRequest& checked, const py::object& loss_fn,
             const py::object& lr_schedule, const py::object& process_group, const py::object& replica_group,
             const std::vector<std::pair<std::string, at::Tensor>>& tensors)
      : raised_(std::make_shared<RaisedInStep>()) {
    CheckedRequest request = checked;  // a copy: the Python object may build again
    const Model built_from = model_of(model, tensors);
    if (!loss_fn.is_none()) request.attach_loss(python_loss(loss_fn, raised_));
    if (!lr_schedule.is_none()) request.attach_lr_schedule(python_lr_schedule(lr_schedule, raised_));
    if (!process_group.is_none()) {
      request.attach_groups(
          process_groups(process_group, replica_group, request.request().options.timeout().count() / 1000.0));
    }
    // Building may run the model (balance "time" profiles it), and autograd
    // and the Python callbacks need the GIL free.
    released([&] {
      binding_ = c10::make_intrusive<PipelineBinding>(std::make_unique<Pipeline>(built_from, std::move(request)));
    });
    if (built().prediction()) prediction_ = std::make_shared<const Prediction>(*built().prediction());
  }

  StepReport train_step(const py::object& input, const py::object& target) {
    const Tensors inputs = tensors_from("input", input), targets = tensors_from("target", target);
    StepReport report;
    static_cast<StepResult&>(report) = released([&] { return built().train_step(inputs, targets); });
    report.prediction = prediction_;
    return report;
  }

  const std::shared_ptr<const Prediction>& prediction() const { return prediction_; }

  py::object forward(const py::object& input) {
    const Tensors inputs = tensors_from("input", input);
    return python_tensors(released([&] { return built().forward(inputs); }));
  }

  PipelineBinding& binding() { return *binding_; }
  Pipeline& built() { return binding_->built(); }

 private:
  // Runs `fn` without the GIL; a Python callback's exception is raised as itself.
  template <typename Fn>
  auto released(Fn&& fn) -> decltype(fn()) {
    raised_->take();
    try {
      py::gil_scoped_release nogil;
      return fn();
    } catch (const std::exception& e) {
      if (auto error = raised_->take()) {
        if (const auto* p = dynamic_cast<const PipelineError*>(&e); p && py::hasattr(error->value(), "add_note")) {
          error->value().attr("add_note")(c10::str("(raised in conveyor stage ", p->stage(), ", micro-batch ",
                                                   p->microbatch(), ", action ", p->action(),
                                                   "; the step was rolled back)"));
        }
        throw std::move(*error);
      }
      throw;
    }
  }

  static Model model_of(const py::object& model, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
    if (!py::isinstance<py::str>(model)) return py::cast<torch::jit::Module>(model);
    const auto path = py::cast<std::string>(model);
    if (tensors.empty()) return path;
#ifdef CONVEYOR_WITH_EXPORT
    return std::make_shared<const ExportedModel>(load_exported(path, tensors));
#else
    throw std::invalid_argument("conveyor: this build reads no torch.export programs (configured without them)");
#endif
  }

  std::shared_ptr<RaisedInStep> raised_;
  c10::intrusive_ptr<PipelineBinding> binding_;
  std::shared_ptr<const Prediction> prediction_;
};

py::dict prediction_dict(const Prediction& predicted) {
  py::dict out;
  out["step_seconds"] = predicted.step_seconds();
  out["bubble"] = predicted.bubble_fraction();
  py::list stages;
  for (const auto& s : predicted.predicted) {
    py::dict d;
    d["forward_seconds"] = s.forward_seconds;
    d["backward_seconds"] = s.backward_seconds;
    d["transfer_seconds"] = s.transfer_seconds;
    d["peak_bytes"] = s.peak_bytes();
    stages.append(d);
  }
  out["stages"] = stages;
  out["text"] = predicted.str();
  return out;
}

void raise_conveyor_error(const char* name, const PipelineError& e) {
  const py::object cls = py::module_::import("conveyor._errors").attr(name);
  const py::object error = cls(message_of(e), e.stage(), e.microbatch(), e.action());
  PyErr_SetObject(cls.ptr(), error.ptr());
}

void translate_errors(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const DivergenceError& e) {
    raise_conveyor_error("DivergenceError", e);
  } catch (const PipelineError& e) {
    raise_conveyor_error(e.timed_out() ? "PipelineTimeoutError" : "PipelineError", e);
  } catch (const TimeoutError& e) {
    PyErr_SetString(PyExc_TimeoutError, message_of(e).c_str());
  } catch (const OptionTypeError& e) {
    PyErr_SetString(PyExc_TypeError, message_of(e).c_str());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, message_of(e).c_str());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace
}  // namespace conveyor

PYBIND11_MODULE(_C, m) {
  using namespace conveyor;
  m.doc() = "Conveyor's extension module; use the conveyor package's Pipeline.";
  m.attr("__version__") = CONVEYOR_VERSION;
  m.attr("torch_version") = CONVEYOR_TORCH_VERSION;
  py::register_exception_translator(translate_errors);
  define_options(m);
  define_schedules(m);
  m.def(
      "layout",
      [](int world_size, int workers) {
        const HybridLayout layout = HybridLayout::for_world(world_size, workers);
        std::vector<std::vector<int>> pipelines, replica_sets;
        for (int d = 0; d < layout.replicas; ++d) pipelines.push_back(layout.pipeline_ranks(d));
        for (int k = 0; k < layout.workers; ++k) replica_sets.push_back(layout.replica_ranks(k));
        return py::make_tuple(pipelines, replica_sets);
      },
      "The ranks of each replica's pipeline (by worker) and of each worker's replicas (by replica) in a job of "
      "world_size processes (conveyor::HybridLayout).");
  m.def("shard", &shard, py::arg("batch"), py::arg("replica"), py::arg("replicas"), py::arg("dim") = 0,
        "Replica `replica`'s equal, contiguous slice of `batch` along `dim` (conveyor::shard).");

  py::class_<StepReport>(m, "StepResult")
      .def_readonly("loss", &StepResult::loss)
      .def_readonly("microbatch_losses", &StepResult::microbatch_losses)
      .def_readonly("wall_seconds", &StepResult::wall_seconds)
      .def_readonly("busy_seconds", &StepResult::busy_seconds)
      .def_readonly("bubble", &StepResult::bubble_fraction)
      .def_readonly("peak_inflight", &StepResult::peak_inflight)
      .def_readonly("peak_stash_bytes", &StepResult::peak_stash_bytes)
      .def_readonly("peak_weight_versions", &StepResult::peak_weight_versions)
      .def_readonly("updates", &StepResult::updates)
      .def_readonly("stepped", &StepResult::stepped)
      .def_readonly("skipped_updates", &StepResult::skipped_updates)
      .def_readonly("loss_scale", &StepResult::loss_scale)
      .def_readonly("grad_norm", &StepResult::grad_norm)
      .def_readonly("activation_bytes_sent", &StepResult::activation_bytes_sent)
      .def_readonly("gradient_bytes_sent", &StepResult::gradient_bytes_sent)
      .def_property_readonly("trace",
                             [](const StepReport& r) {
                               py::list stages;
                               for (const auto& row : r.trace) {
                                 py::list events;
                                 for (const auto& e : row) {
                                   events.append(py::make_tuple(e.action.str(), e.start_us * 1e-6, e.end_us * 1e-6));
                                 }
                                 stages.append(events);
                               }
                               return stages;
                             })
      .def("chrome_trace_json", &StepResult::chrome_trace_json)
      .def("write_chrome_trace", &StepResult::write_chrome_trace, py::arg("path"))
      .def_property_readonly("prediction",
                             [](const StepReport& r) -> py::object {
                               return r.prediction ? py::object(prediction_dict(*r.prediction)) : py::none();
                             })
      .def("timeline_svg", [](const StepReport& r) { return timeline_svg(r.timeline()); })
      .def(
          "write_timeline", [](const StepReport& r, const std::string& path) { write_timeline(path, r.timeline()); },
          py::arg("path"));

  py::class_<PyPipeline>(m, "Pipeline")
      .def(py::init<py::object, const CheckedRequest&, py::object, py::object, py::object, py::object,
                    std::vector<std::pair<std::string, at::Tensor>>>(),
           py::arg("model"), py::arg("options"), py::arg("loss_fn"), py::arg("lr_schedule"), py::arg("process_group"),
           py::arg("replica_group"), py::arg("tensors") = std::vector<std::pair<std::string, at::Tensor>>())
      .def("options", [](PyPipeline& p) { return options_of(p.built()); })
      .def("train_step", &PyPipeline::train_step)
      .def("forward", &PyPipeline::forward)
      .def("clip_grad_norm",
           [](PyPipeline& p, double max_norm, double norm_type) {
             py::gil_scoped_release nogil;
             return p.binding().clip_grad_norm(max_norm, norm_type);
           })
      .def("placement",
           [](PyPipeline& p) -> py::tuple {  // (worker, replicas, replica)
             DistributedRunner* d = p.built().distributed();
             if (!d) return py::make_tuple(0, 1, 0);
             const ProcessGroups& g = d->groups();
             return py::make_tuple(g.worker(), g.layout().replicas, g.replica());
           })
      .def("shared_memory_links",
           [](PyPipeline& p) {  // DistributedRunner::shared_memory_links; 0 in one process
             DistributedRunner* d = p.built().distributed();
             return d ? d->shared_memory_links() : 0;
           })
      .def("unshard",
           [](PyPipeline& p) {  // DistributedRunner::unshard; nothing in one process
             if (DistributedRunner* d = p.built().distributed()) d->unshard();
           })
      .def("reshard",
           [](PyPipeline& p) {
             if (DistributedRunner* d = p.built().distributed()) d->reshard();
           })
      .def("parameters", [](PyPipeline& p) { return p.binding().parameters(); })
      .def("named_parameters", [](PyPipeline& p) { return p.built().named_parameters(); })
      .def("named_buffers", [](PyPipeline& p) { return p.built().named_buffers(); })
      .def("state_dict", [](PyPipeline& p) { return p.built().state_dict(); })
      .def("load_state_dict",
           [](PyPipeline& p, const std::vector<std::pair<std::string, at::Tensor>>& state, bool strict) {
             const auto keys = p.built().load_state_dict(state, strict);
             return py::make_tuple(keys.missing, keys.unexpected);
           })
      .def("train", [](PyPipeline& p, bool on) { p.binding().train(on); })
      .def("num_stages", [](PyPipeline& p) { return p.binding().num_stages(); })
      .def("num_workers", [](PyPipeline& p) { return p.built().num_workers(); })
      .def("schedule", [](PyPipeline& p) { return p.binding().schedule(); })
      .def("plan", [](PyPipeline& p) { return p.binding().plan(); })
      .def("prediction",
           [](PyPipeline& p) -> py::object {
             return p.prediction() ? py::object(prediction_dict(*p.prediction())) : py::none();
           })
      .def("fused_ops_report", [](PyPipeline& p) { return p.binding().fused_ops_report(); })
      .def("completed_steps", [](PyPipeline& p) { return p.built().completed_steps(); })
      .def("save_checkpoint",
           [](PyPipeline& p, const std::string& path, int64_t step) { p.binding().save_checkpoint(path, step); })
      .def("load_checkpoint",
           [](PyPipeline& p, const std::string& path) { return p.binding().load_checkpoint(path); })
      .def("save_model_state", [](PyPipeline& p, const std::string& path) { p.binding().save_model_state(path); });
}
