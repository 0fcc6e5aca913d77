#pragma once
// A BuildRequest (plugin/builder/request.h) from a dict of options, as
// Python hands them over: the conveyor package's keywords
// (python/src/module.cpp) and the TorchScript class's dict (torch_class.cpp).
//
// The dict's keys are the option rows (plugin/core/option_list.h), each value of its
// row's type (read by option_values.h; None: the default); and two that are
// objects: loss ("cross_entropy" over the last dimension | "mse" | a
// scripted module called as loss(*outputs, *targets); default "mse") and
// sample (an (input, target) batch, each a tensor or a tuple of tensors).

#include "plugin/builder/request.h"
#include "plugin/builder/front_end.h"
#include "plugin/core/option_values.h"

#include <ATen/core/ivalue.h>

#include <set>
#include <string>

namespace conveyor {

// The option names a dict may hold, sorted.
const std::set<std::string>& dict_option_names();

// The request the dict describes. Throws std::invalid_argument naming an
// unknown key (with the known ones) or a bad value, OptionTypeError for a
// value of the wrong type.
BuildRequest request_from_dict(const PythonOptions& options, ValueText text);

// A model as Python hands it over: a ScriptModule, or the path of a
// TorchScript file or a .pt2 archive; std::invalid_argument for anything else.
Model model_from_value(const c10::IValue& model);

}  // namespace conveyor
