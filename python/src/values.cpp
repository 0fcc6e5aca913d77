#include "python/src/values.h"

#include "plugin/builder/option_table.h"
#include "plugin/core/option_values.h"

#include <torch/csrc/Dtype.h>
#include <torch/extension.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace conveyor {

py::object python_tensors(const Tensors& tensors) {
  if (tensors.size() == 1) return py::cast(tensors[0]);
  py::tuple out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) out[i] = tensors[i].defined() ? py::cast(tensors[i]) : py::none();
  return out;
}

c10::IValue ivalue_of(const py::handle& v, const std::string& what) {
  if (v.is_none()) return {};
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>();
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (THPVariable_Check(v.ptr())) return v.cast<at::Tensor>();
  if (THPDtype_Check(v.ptr())) return py::str(v).cast<std::string>().substr(6);  // "torch.bfloat16": "bfloat16"
  if (py::isinstance<py::tuple>(v)) {
    std::vector<c10::IValue> items;
    for (const auto& item : v) items.push_back(ivalue_of(item, what));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (py::isinstance<py::list>(v)) {
    c10::impl::GenericList items(c10::AnyType::get());
    for (const auto& item : v) items.push_back(ivalue_of(item, what));
    return items;
  }
  if (py::isinstance<py::dict>(v)) {
    c10::impl::GenericDict items(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(v)) {
      items.insert(py::str(key).cast<std::string>(), ivalue_of(value, what));
    }
    return items;
  }
  if (py::hasattr(v, "_c") && py::isinstance<torch::jit::Module>(v.attr("_c"))) {
    return v.attr("_c").cast<torch::jit::Module>()._ivalue();
  }
  throw std::invalid_argument("conveyor.Pipeline: " + what + " cannot be a " +
                              py::str(py::type::handle_of(v).attr("__name__")).cast<std::string>());
}

py::object python_of(const c10::IValue& v) {
  if (v.isNone()) return py::none();
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isString()) return py::str(v.toStringRef());
  if (v.isList()) {
    py::list out;
    for (const c10::IValue& item : v.toListRef()) out.append(python_of(item));
    return out;
  }
  if (v.isGenericDict()) {
    py::dict out;
    for (const auto& entry : v.toGenericDict()) out[python_of(entry.key())] = python_of(entry.value());
    return out;
  }
  throw std::logic_error("conveyor: no Python value for an option's " + std::string(v.tagKind()));
}

py::list option_table() {
  py::list out;
  for (const OptionDescription& row : every_option()) {
    py::dict d;
    d["section"] = row.section;
    d["name"] = row.name;
    d["type"] = row.type.empty() ? py::object(py::none()) : py::object(py::str(row.type));
    d["default"] = python_of(row.default_value);
    d["doc"] = row.doc;
    d["bound"] = row.bound;
    d["choices"] = row.choices;
    out.append(d);
  }
  return out;
}

Tensors tensors_from(const char* what, const py::handle& value) {
  return as_tensors(what, ivalue_of(value, std::string("the ") + what));
}

py::dict options_of(const Pipeline& pipe) {
  py::dict out;
  for (const auto& row : every_option(pipe.options())) {
    if (!row.type.empty()) out[py::str(row.name)] = python_of(row.default_value);
  }
  return out;
}

}  // namespace conveyor
