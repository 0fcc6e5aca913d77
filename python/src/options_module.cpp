#include "python/src/options_module.h"

#include "plugin/pipeline.h"
#include "plugin/builder/dict_options.h"
#include "plugin/builder/front_end.h"
#include "plugin/builder/option_table.h"
#include "plugin/core/errors.h"
#include "python/src/values.h"

#include <torch/extension.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>

namespace py = pybind11;

namespace conveyor {

namespace {

// The request the keywords describe (plugin/builder/dict_options.h).
BuildRequest request_of(const py::dict& options) {
  c10::impl::GenericDict generic(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, value] : options) {
    const auto name = py::cast<std::string>(key);
    generic.insert(name, ivalue_of(value, "option '" + name + "'"));
  }
  return request_from_dict(c10::impl::toTypedDict<std::string, c10::IValue>(std::move(generic)), ValueText::kTyped);
}

}  // namespace

void define_options(py::module_& m) {
  py::class_<CheckedRequest>(m, "CheckedOptions",
                             "conveyor.Pipeline's options, parsed and checked: what _C.Pipeline builds.");
  m.def(
      "check_options",
      [](const py::dict& options, bool has_loss, int processes, const std::string& model_kind) {
        check_argument(model_kind.empty() || model_kind == "export" || model_kind == "script",
                       "conveyor: no model kind '", model_kind, "'");
        BuildRequest request = request_of(options);
        if (has_loss) request.loss = [](const Tensors&, const Tensors&) { return at::Tensor(); };  // attached later
        std::optional<ModelKind> kind;
        if (!model_kind.empty()) kind = model_kind == "export" ? ModelKind::exported : ModelKind::script;
        return CheckedRequest(std::move(request), processes, kind);
      },
      py::arg("options"), py::arg("has_loss"), py::arg("processes"), py::arg("model_kind"),
      "Parses and checks the options once: refuses (TypeError, ValueError naming it) an option a pipeline "
      "built with these keywords would refuse before it reads the model, or that a model of `model_kind` "
      "('export' or 'script', the front end's; '' where the model is a file, read at the build) cannot "
      "take, and returns them for _C.Pipeline.");
  m.def(
      "request_counts",
      [] {
        const RequestCounts c = request_counts();
        return py::dict(py::arg("parses") = c.parses, py::arg("checks") = c.checks,
                        py::arg("plan_checks") = c.plan_checks, py::arg("kind_checks") = c.kind_checks);
      },
      "How often this process parsed and checked a pipeline's options (each once a construction).");
  m.def(
      "python_keywords",
      [] {
        py::list out;
#define CONVEYOR_PYTHON_KEYWORD_ROW(name, annotation, doc) \
  out.append(py::dict(py::arg("name") = #name, py::arg("type") = annotation, py::arg("doc") = doc));
        CONVEYOR_PYTHON_KEYWORDS(CONVEYOR_PYTHON_KEYWORD_ROW)
#undef CONVEYOR_PYTHON_KEYWORD_ROW
        return out;
      },
      "conveyor.Pipeline's keywords that hold Python objects: name, Python type and documentation (empty: the "
      "C++ row of that name's).");
  m.def("option_table", &option_table,
        "Every option's section, name, Python type (None: C++ only), default, documentation, bound and choices.");
  m.def("options_reference", &options_reference, "Every option as a markdown table per section.");
}

}  // namespace conveyor
