#pragma once
// Python values and the IValues the C++ side reads (conveyor._C): tensors
// and tuples of them, option values both ways, and the option rows as
// Python describes them.

#include "ops/adapters.h"
#include "plugin/pipeline.h"

#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>

#include <string>

namespace conveyor {

// One tensor as itself, several (None for an empty slot) as a tuple.
pybind11::object python_tensors(const Tensors& tensors);

// What Pipeline reads from Python values: None, bool, int, float, str,
// torch.dtype (its name), tensors, lists, tuples, dicts of them, and
// ScriptModules (a scripted loss). Anything else is a std::invalid_argument
// naming `what`.
c10::IValue ivalue_of(const pybind11::handle& v, const std::string& what);

// The Python value of an option's IValue (OptionValue<T>::write).
pybind11::object python_of(const c10::IValue& v);

// A tensor or a tuple of them; `what` ("input", "target") names it in errors.
Tensors tensors_from(const char* what, const pybind11::handle& value);

// Every option's row as Python describes it (conveyor._C.option_table()).
pybind11::list option_table();

// Every option Python can give, by name, as `pipe` runs with it.
pybind11::dict options_of(const Pipeline& pipe);

}  // namespace conveyor
