// The ExportedProgram's JSON read with the schema's C++ types that ship with
// LibTorch (torch/csrc/utils/generated_serialization_types.h), turned into
// the interpreter's Program. The only file that includes the JSON library.
#include "plugin/export/program.h"

#include "plugin/export/program_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace conveyor::exported {

namespace ser = torch::_export;

namespace {

constexpr int kSchemaMajor = 8;

std::vector<std::string> split(const std::string& s, char by) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == by) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

// The module path of a node from its nn_module_stack ("key,path,type;..."):
// the innermost module, and the layer it belongs to (the top-level module,
// or an item of a top-level Sequential, ModuleList or ModuleDict).
void module_paths(const std::unordered_map<std::string, std::string>& metadata, Node& node) {
  const auto it = metadata.find("nn_module_stack");
  if (it == metadata.end() || it->second.empty()) return;
  std::vector<std::pair<std::string, std::string>> stack;  // (path, type)
  for (const std::string& entry : split(it->second, ';')) {
    const auto fields = split(entry, ',');
    if (fields.size() < 3 || fields[0].rfind("_empty_nn_module_stack", 0) == 0) continue;
    stack.emplace_back(fields[1], fields.back());
  }
  if (stack.empty()) return;
  node.module_path = stack.back().first;
  size_t depth = stack.front().first.empty() ? 1 : 0;  // the model itself has the path ""
  if (depth >= stack.size()) return;
  const std::string& type = stack[depth].second;
  const bool container = type.find("container.Sequential") != std::string::npos ||
                         type.find("container.ModuleList") != std::string::npos ||
                         type.find("container.ModuleDict") != std::string::npos;
  if (container && depth + 1 < stack.size()) ++depth;
  node.unit = stack[depth].first;
}

SymOp sym_op_of(const std::string& target) {
  static const std::map<std::string, SymOp> ops = {
      {"_operator.add", SymOp::kAdd},      {"_operator.sub", SymOp::kSub},  {"_operator.mul", SymOp::kMul},
      {"_operator.floordiv", SymOp::kFloorDiv}, {"_operator.mod", SymOp::kMod}, {"_operator.neg", SymOp::kNeg},
      {"_operator.eq", SymOp::kEq},        {"_operator.ne", SymOp::kNe},    {"_operator.lt", SymOp::kLt},
      {"_operator.le", SymOp::kLe},        {"_operator.gt", SymOp::kGt},    {"_operator.ge", SymOp::kGe},
      {"torch.sym_max", SymOp::kMax},      {"torch.sym_min", SymOp::kMin}};
  const auto it = ops.find(target);
  return it == ops.end() ? SymOp::kNone : it->second;
}

class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  Program read(const ser::ExportedProgram& ep) {
    const auto& version = ep.get_schema_version();
    p_.schema_version = std::to_string(version.get_major()) + "." + std::to_string(version.get_minor());
    p_.torch_version = ep.get_torch_version();
    if (version.get_major() != kSchemaMajor) {
      throw std::invalid_argument(where_ + ": the program is of ExportedProgram schema version " +
                                  p_.schema_version + (p_.torch_version.empty() ? "" : " (torch " + p_.torch_version +
                                  ")") + ", and this build reads version " + std::to_string(kSchemaMajor) +
                                  ".x: export it again with a torch whose schema is " + std::to_string(kSchemaMajor));
    }
    const ser::GraphModule& gm = ep.get_graph_module();
    const ser::Graph& graph = gm.get_graph();
    read_inputs(gm.get_signature(), graph);
    for (const ser::Node& n : graph.get_nodes()) p_.nodes.push_back(read_node(n));
    read_outputs(gm.get_signature());
    return std::move(p_);
  }

 private:
  int define(const std::string& name, const std::string& by, bool symbolic = false) {
    if (!slots_.emplace(name, p_.num_slots()).second) {
      throw std::invalid_argument(where_ + ": " + by + " defines '" + name + "' a second time");
    }
    p_.value_names.push_back(name);
    p_.symbolic.push_back(symbolic);
    return p_.num_slots() - 1;
  }

  int use(const std::string& name, const std::string& by) const {
    const auto it = slots_.find(name);
    if (it == slots_.end()) {
      throw std::invalid_argument(where_ + ": " + by + " reads '" + name + "', which nothing before it defines");
    }
    return it->second;
  }

  void read_inputs(const ser::GraphSignature& sig, const ser::Graph& graph) {
    using Tag = ser::InputSpec::Tag;
    for (const ser::InputSpec& spec : sig.get_input_specs()) {
      switch (spec.tag()) {
        case Tag::PARAMETER: {
          const auto& s = spec.get_parameter();
          p_.state.push_back({s.get_parameter_name(), define(s.get_arg().get_name(), "the signature"), true, true});
          break;
        }
        case Tag::BUFFER: {
          const auto& s = spec.get_buffer();
          p_.state.push_back(
              {s.get_buffer_name(), define(s.get_arg().get_name(), "the signature"), false, s.get_persistent()});
          break;
        }
        case Tag::TENSOR_CONSTANT: {
          const auto& s = spec.get_tensor_constant();
          p_.state.push_back(
              {s.get_tensor_constant_name(), define(s.get_arg().get_name(), "the signature"), false, false, true});
          break;
        }
        case Tag::USER_INPUT: {
          const ser::Argument& a = spec.get_user_input().get_arg();
          UserInput in;
          if (a.tag() == ser::Argument::Tag::AS_TENSOR) {
            in.name = a.get_as_tensor().get_name();
            const auto meta = graph.get_tensor_values().find(in.name);
            if (meta != graph.get_tensor_values().end()) {
              for (const ser::SymInt& s : meta->second.get_sizes()) {
                in.static_size.push_back(s.tag() == ser::SymInt::Tag::AS_INT ? s.get_as_int() : -1);
              }
            }
          } else {
            in.tensor = false;
            in.name = "input " + std::to_string(p_.inputs.size());
            in.constant = user_constant(a);
          }
          in.slot = define(in.name, "the signature");
          p_.inputs.push_back(std::move(in));
          break;
        }
        case Tag::CUSTOM_OBJ:
          throw std::invalid_argument(where_ + ": the program takes a custom object (a TorchBind class), which the "
                                      "interpreter cannot hold");
        default:
          throw std::invalid_argument(where_ + ": the program takes an input of a kind the interpreter does not read "
                                      "(an effect token or a constant input)");
      }
    }
  }

  c10::IValue user_constant(const ser::Argument& a) const {
    using Tag = ser::Argument::Tag;
    switch (a.tag()) {
      case Tag::AS_NONE: return {};
      case Tag::AS_INT: return a.get_as_int();
      case Tag::AS_FLOAT: return a.get_as_float().get();
      case Tag::AS_BOOL: return a.get_as_bool();
      case Tag::AS_STRING: return a.get_as_string();
      default:
        throw std::invalid_argument(where_ + ": the program takes an input of kind " + tag_name(a) +
                                    ", which the interpreter does not read");
    }
  }

  void read_outputs(const ser::GraphSignature& sig) {
    using Tag = ser::OutputSpec::Tag;
    for (const ser::OutputSpec& spec : sig.get_output_specs()) {
      if (spec.tag() == Tag::USER_OUTPUT) {
        const ser::Argument& a = spec.get_user_output().get_arg();
        if (a.tag() != ser::Argument::Tag::AS_TENSOR) {
          throw std::invalid_argument(where_ + ": the program returns a " + tag_name(a) +
                                      ": a pipeline's model returns tensors only");
        }
        p_.outputs.push_back(use(a.get_as_tensor().get_name(), "the program's output"));
      } else if (spec.tag() == Tag::BUFFER_MUTATION) {
        const auto& m = spec.get_buffer_mutation();
        p_.buffer_mutations.emplace_back(m.get_buffer_name(), use(m.get_arg().get_name(), "a buffer mutation"));
      } else if (spec.tag() == Tag::LOSS_OUTPUT || spec.tag() == Tag::GRADIENT_TO_PARAMETER ||
                 spec.tag() == Tag::GRADIENT_TO_USER_INPUT) {
        throw std::invalid_argument(where_ + ": the program is a joint forward and backward graph; export the "
                                    "forward only (torch.export.export), the pipeline makes the backward");
      } else {
        throw std::invalid_argument(where_ + ": the program mutates one of its inputs or parameters in its "
                                    "signature, which the interpreter does not apply");
      }
    }
    if (p_.outputs.empty()) throw std::invalid_argument(where_ + ": the program returns no tensor");
  }

  Node read_node(const ser::Node& n) {
    Node node;
    node.target = n.get_target();
    node.name = n.get_name().value_or(n.get_outputs().empty() ? node.target : first_output_name(n));
    module_paths(n.get_metadata(), node);
    const std::string who = "node '" + node.name + "' (" + node.target + ")";
    node.sym = sym_op_of(node.target);
    if (node.sym != SymOp::kNone) {
      for (const ser::NamedArgument& a : n.get_inputs()) node.args.push_back(sym_arg(a.get_arg(), who));
      if (n.get_outputs().size() != 1) throw std::invalid_argument(where_ + ": " + who + " has no single result");
      node.outs.push_back(Out{{define(value_name(n.get_outputs()[0], who), who, true)}, false});
      return node;
    }
    node.op = find_operator(node.target, who, where_);
    const c10::FunctionSchema& schema = node.op->schema();
    std::map<std::string, const ser::Argument*> given;
    for (const ser::NamedArgument& a : n.get_inputs()) given[a.get_name()] = &a.get_arg();
    for (const c10::Argument& sa : schema.arguments()) {
      const auto it = given.find(sa.name());
      if (it == given.end()) {
        if (!sa.default_value()) {
          throw std::invalid_argument(where_ + ": " + who + " gives no argument '" + sa.name() + "'");
        }
        node.args.push_back(Arg::with_constant(*sa.default_value()));
      } else {
        node.args.push_back(convert(*it->second, sa, who));
        given.erase(it);
      }
      if (training_argument(schema.operator_name(), sa.name())) node.training_arg = node.args.size() - 1;
    }
    if (!given.empty()) {
      throw std::invalid_argument(where_ + ": " + who + " passes '" + given.begin()->first + "', which " +
                                  schema.name() + " does not take");
    }
    node.counts_batches = schema.name() == "aten::add_" && !node.args.empty() &&
                          node.args[0].kind == Arg::Kind::kValue && counts_batches(node.args[0].slot);
    read_returns(n, schema, node, who);
    return node;
  }

  static std::string first_output_name(const ser::Node& n) {
    const ser::Argument& a = n.get_outputs()[0];
    return a.tag() == ser::Argument::Tag::AS_TENSOR ? a.get_as_tensor().get_name() : "";
  }

  bool counts_batches(int slot) const {
    for (const State& s : p_.state) {
      if (s.slot == slot && s.name.size() >= 19 && s.name.substr(s.name.size() - 19) == "num_batches_tracked") {
        return true;
      }
    }
    return false;
  }

  std::string value_name(const ser::Argument& a, const std::string& who) const {
    using Tag = ser::Argument::Tag;
    switch (a.tag()) {
      case Tag::AS_TENSOR: return a.get_as_tensor().get_name();
      case Tag::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME) return a.get_as_sym_int().get_as_name();
        break;
      case Tag::AS_SYM_FLOAT:
        if (a.get_as_sym_float().tag() == ser::SymFloatArgument::Tag::AS_NAME) {
          return a.get_as_sym_float().get_as_name();
        }
        break;
      case Tag::AS_SYM_BOOL:
        if (a.get_as_sym_bool().tag() == ser::SymBoolArgument::Tag::AS_NAME) return a.get_as_sym_bool().get_as_name();
        break;
      default: break;
    }
    throw std::invalid_argument(where_ + ": " + who + " returns a " + tag_name(a) + ", which the interpreter "
                                "does not keep");
  }

  void read_returns(const ser::Node& n, const c10::FunctionSchema& schema, Node& node, const std::string& who) {
    const auto& outs = n.get_outputs();
    const size_t returns = schema.returns().size();
    if (outs.size() != returns && !(returns == 0 && outs.size() == 1 && outs[0].tag() == ser::Argument::Tag::AS_NONE)) {
      throw std::invalid_argument(where_ + ": " + who + " names " + std::to_string(outs.size()) + " results, and " +
                                  schema.name() + " returns " + std::to_string(returns));
    }
    for (size_t i = 0; i < returns; ++i) {
      const ser::Argument& a = outs[i];
      Out out;
      if (a.tag() == ser::Argument::Tag::AS_NONE) {
        out.slots.push_back(-1);
      } else if (a.tag() == ser::Argument::Tag::AS_TENSORS) {
        out.list = true;
        for (const auto& t : a.get_as_tensors()) out.slots.push_back(define(t.get_name(), who));
      } else {
        out.slots.push_back(define(value_name(a, who), who, a.tag() != ser::Argument::Tag::AS_TENSOR));
      }
      node.outs.push_back(std::move(out));
    }
  }

  Arg sym_arg(const ser::Argument& a, const std::string& who) const {
    using Tag = ser::Argument::Tag;
    switch (a.tag()) {
      case Tag::AS_INT: return Arg::with_constant(a.get_as_int());
      case Tag::AS_FLOAT: return Arg::with_constant(a.get_as_float().get());
      case Tag::AS_BOOL: return Arg::with_constant(a.get_as_bool());
      case Tag::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_INT) {
          return Arg::with_constant(a.get_as_sym_int().get_as_int());
        }
        return value_arg(a.get_as_sym_int().get_as_name(), who);
      default: return value_arg(value_name(a, who), who);
    }
  }

  Arg value_arg(const std::string& name, const std::string& who) const {
    Arg arg;
    arg.kind = Arg::Kind::kValue;
    arg.slot = use(name, who);
    return arg;
  }

  Arg convert(const ser::Argument& a, const c10::Argument& sa, const std::string& who) const {
    using Tag = ser::Argument::Tag;
    const std::string what = who + "'s argument '" + sa.name() + "'";
    Arg arg;
    switch (a.tag()) {
      case Tag::AS_NONE: return arg;
      case Tag::AS_TENSOR: return value_arg(a.get_as_tensor().get_name(), who);
      case Tag::AS_OPTIONAL_TENSOR:
        if (a.get_as_optional_tensor().tag() == ser::OptionalTensorArgument::Tag::AS_NONE) return arg;
        return value_arg(a.get_as_optional_tensor().get_as_tensor().get_name(), who);
      case Tag::AS_TENSORS:
        arg.kind = wants_optional_tensors(sa) ? Arg::Kind::kOptionalTensors : Arg::Kind::kTensors;
        for (const auto& t : a.get_as_tensors()) arg.slots.push_back(use(t.get_name(), who));
        return arg;
      case Tag::AS_OPTIONAL_TENSORS:
        arg.kind = Arg::Kind::kOptionalTensors;
        for (const auto& t : a.get_as_optional_tensors()) {
          arg.slots.push_back(t.tag() == ser::OptionalTensorArgument::Tag::AS_NONE
                                  ? -1 : use(t.get_as_tensor().get_name(), who));
        }
        return arg;
      case Tag::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_INT) {
          arg.constant = number_for(sa, static_cast<double>(a.get_as_sym_int().get_as_int()),
                                    a.get_as_sym_int().get_as_int());
          return arg;
        }
        return value_arg(a.get_as_sym_int().get_as_name(), who);
      case Tag::AS_SYM_INTS:
        arg.kind = Arg::Kind::kInts;
        for (const auto& s : a.get_as_sym_ints()) {
          const bool named = s.tag() == ser::SymIntArgument::Tag::AS_NAME;
          arg.ints.push_back(named ? 0 : s.get_as_int());
          arg.slots.push_back(named ? use(s.get_as_name(), who) : -1);
        }
        return arg;
      case Tag::AS_SYM_FLOAT:
      case Tag::AS_SYM_BOOL: return sym_arg(a, who);
      case Tag::AS_DEVICE:
        arg.kind = Arg::Kind::kDevice;
        arg.constant = device_of(a.get_as_device());
        return arg;
      default: arg.constant = constant_of(a, sa, what, where_); return arg;
    }
  }

  std::string where_;
  Program p_;
  std::map<std::string, int> slots_;
};

}  // namespace

int schema_major_version() { return kSchemaMajor; }

Program read_program(const std::string& json, const std::string& where) {
  ser::ExportedProgram ep;
  try {
    ep = nlohmann::json::parse(json).get<ser::ExportedProgram>();
  } catch (const std::exception& e) {
    throw std::invalid_argument(where + ": the program's JSON is no ExportedProgram this build reads (" + e.what() +
                                ")");
  }
  return Reader(where).read(ep);
}

}  // namespace conveyor::exported
