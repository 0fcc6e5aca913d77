#pragma once
// Reading one node's operator and constant arguments from the ExportedProgram
// schema's types (read_program's helpers, plugin/export/program_json.cpp).

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include <string>

namespace conveyor::exported {

// "as_tensor", "as_graph", ...: what kind of argument `a` is.
std::string tag_name(const torch::_export::Argument& a);

// The operator a node's target names ("torch.ops.aten.linear.default" is
// aten::linear). Throws std::invalid_argument naming `who` for a
// higher-order operator, an operator no loaded library defines, or a target
// that is no operator.
c10::OperatorHandle find_operator(const std::string& target, const std::string& who, const std::string& where);

// Whether the schema argument takes a list of optional tensors (Tensor?[]).
bool wants_optional_tensors(const c10::Argument& sa);

// An int argument as the schema wants it: a float where it takes a float.
c10::IValue number_for(const c10::Argument& sa, double as_float, int64_t as_int);

// The exported device (the layer's own replaces it at run time).
c10::IValue device_of(const torch::_export::Device& d);

// A constant argument (numbers, strings, bools, lists of them, dtypes,
// layouts, memory formats) as the operator's schema wants it. Throws
// std::invalid_argument naming `what` for a kind the interpreter does not
// read (a subgraph, a custom object, an operator, ...).
c10::IValue constant_of(const torch::_export::Argument& a, const c10::Argument& sa, const std::string& what,
                        const std::string& where);

// Whether argument `arg` of `op` says "training" (dropout's train, batch
// norm's training): evaluation mode sets it false.
bool training_argument(const c10::OperatorName& op, const std::string& arg);

}  // namespace conveyor::exported
