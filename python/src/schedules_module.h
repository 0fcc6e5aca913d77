#pragma once
// conveyor._C's functions on the schedule library: the schedules' names and
// their pictures, simulated and drawn by the library itself.

#include <pybind11/pybind11.h>

namespace conveyor {

void define_schedules(pybind11::module_& m);

}  // namespace conveyor
