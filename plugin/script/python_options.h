#pragma once
// Reading the Python class's arguments (plugin/script/python_class.cpp): the
// options dict, its values (also given as strings), and tensors or tuples of
// them. Each bad value is a std::invalid_argument naming the option and what
// Python type arrived.

#include "ops/adapters.h"
#include "plugin/options.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {

using PythonOptions = c10::Dict<std::string, c10::IValue>;

// Python's name for what a value is, for messages.
std::string python_type(const c10::IValue& v);
std::invalid_argument bad_option(const std::string& key, const std::string& expected, const c10::IValue& got);

int64_t as_int(const std::string& key, const c10::IValue& v);
double as_double(const std::string& key, const c10::IValue& v);
bool as_bool(const std::string& key, const c10::IValue& v);
std::string as_string(const std::string& key, const c10::IValue& v);
// A list of str, or one comma-separated str.
std::vector<std::string> as_strings(const std::string& key, const c10::IValue& v);
std::vector<int64_t> as_ints(const std::string& key, const c10::IValue& v);

// The optimizer factory the options "optimizer", "lr", "momentum" and
// "weight_decay" describe (null without "optimizer").
OptimizerFactory optimizer_from(const PythonOptions& options);

// A tensor, or a tuple or list of tensors (None for an empty slot); `what`
// ("input", "target") names it in errors.
Tensors as_tensors(const char* what, const c10::IValue& v);

}  // namespace conveyor
