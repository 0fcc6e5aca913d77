#pragma once
// conveyor._C's functions on options: parsing and checking them once
// (CheckedOptions), what a model's kind allows, the counts that test it, and
// the option table and Python keywords the package and the manual read.

#include <pybind11/pybind11.h>

namespace conveyor {

void define_options(pybind11::module_& m);

}  // namespace conveyor
