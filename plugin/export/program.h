#pragma once
// A torch.export program as the interpreter runs it: every value of the
// graph (tensors, symbolic ints, floats and bools) has a slot, numbered in
// the order the graph defines them (the program's inputs first, then each
// node's outputs); every node is an operator with its arguments already in
// the operator schema's order, each a constant, a slot or a list mixing both.
// Made from the archive's JSON by read_program (plugin/export/program_json.cpp),
// which refuses at load time what the interpreter cannot run.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor::exported {

// One argument of a node, in the operator schema's order.
struct Arg {
  enum class Kind {
    kConstant,        // `constant`
    kValue,           // the value in slot `slot`
    kTensors,         // a list of tensors: `slots`
    kOptionalTensors, // a list of optional tensors: `slots`, -1 for None
    kInts,            // a list of ints: `ints`, where `slots` is -1, else that slot's value
    kDevice,          // a device: the layer's own (see Node)
  };
  Kind kind = Kind::kConstant;
  c10::IValue constant;
  int slot = -1;
  std::vector<int> slots;
  std::vector<int64_t> ints;

  static Arg with_constant(c10::IValue value) {
    Arg a;
    a.constant = std::move(value);
    return a;
  }
};

// Where one of an operator's returns goes.
struct Out {
  std::vector<int> slots;  // one slot, or one per element of a returned list; -1: dropped
  bool list = false;
};

// The arithmetic of symbolic sizes that the graph does in Python (_operator.mul).
enum class SymOp { kNone, kAdd, kSub, kMul, kFloorDiv, kMod, kNeg, kEq, kNe, kLt, kLe, kGt, kGe, kMax, kMin };

struct Node {
  std::string name;         // the graph's name for it ("linear_3")
  std::string target;       // "torch.ops.aten.linear.default"
  std::string module_path;  // innermost module it came from ("body.2"); "" at the top
  std::string unit;         // the layer it belongs to without split points (see export_graph.h)
  std::optional<c10::OperatorHandle> op;
  SymOp sym = SymOp::kNone;
  std::vector<Arg> args;
  std::vector<Out> outs;
  // The argument that says "training" (dropout's train, batch norm's
  // training): false in evaluation mode; -1 when there is none.
  int training_arg = -1;
  // Updates num_batches_tracked: skipped in evaluation mode.
  bool counts_batches = false;
};

// A tensor the program holds: a parameter, a buffer or a constant.
struct State {
  std::string name;  // the model's name ("body.0.weight")
  int slot = -1;
  bool parameter = false;
  bool persistent = true;  // buffers: part of the state dict
  bool constant = false;   // a lifted tensor constant: no parameter, no buffer
};

struct UserInput {
  std::string name;
  int slot = -1;
  bool tensor = true;
  c10::IValue constant;             // a non-tensor input, as exported
  std::vector<int64_t> static_size; // -1 where the dimension is dynamic
};

struct Program {
  std::vector<std::string> value_names;  // by slot
  std::vector<bool> symbolic;            // by slot: a symbolic size (a number), not a tensor
  std::vector<Node> nodes;
  std::vector<State> state;  // parameters, buffers, constants, in the signature's order
  std::vector<UserInput> inputs;
  std::vector<int> outputs;  // the user outputs' slots
  // Buffers the program returns a new value for (a functional graph):
  // buffer name -> slot of its new value.
  std::vector<std::pair<std::string, int>> buffer_mutations;
  std::string schema_version;  // "8.20"
  std::string torch_version;   // the version that exported it
  int num_slots() const { return static_cast<int>(value_names.size()); }
};

// The program in `json` (an archive's models/<name>.json). `where` names the
// archive in messages. Throws std::invalid_argument for a schema version this
// build does not read, a graph it cannot run (naming the node and its
// operator), or JSON that is no ExportedProgram.
Program read_program(const std::string& json, const std::string& where);

// The schema major version this build reads.
int schema_major_version();

}  // namespace conveyor::exported
