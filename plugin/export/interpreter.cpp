#include "plugin/export/interpreter.h"

#include "plugin/core/errors.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <type_traits>
#include <utility>

namespace conveyor::exported {

namespace {

int64_t floor_div(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "division of a size by zero");
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Python's arithmetic on sizes (int64_t) or symbolic floats (double).
template <typename T>
c10::IValue arithmetic(SymOp op, T x, T y) {
  switch (op) {
    case SymOp::kAdd: return x + y;
    case SymOp::kSub: return x - y;
    case SymOp::kMul: return x * y;
    case SymOp::kMax: return std::max(x, y);
    case SymOp::kMin: return std::min(x, y);
    case SymOp::kEq: return x == y;
    case SymOp::kNe: return x != y;
    case SymOp::kLt: return x < y;
    case SymOp::kLe: return x <= y;
    case SymOp::kGt: return x > y;
    case SymOp::kGe: return x >= y;
    case SymOp::kFloorDiv:
      if constexpr (std::is_integral_v<T>) return floor_div(x, y);
      break;
    case SymOp::kMod:
      if constexpr (std::is_integral_v<T>) return x - floor_div(x, y) * y;
      break;
    default: break;
  }
  TORCH_CHECK(false, "this arithmetic of symbolic ", std::is_integral_v<T> ? "sizes" : "floats", " is not supported");
}

c10::IValue symbolic(SymOp op, const c10::IValue& a, const c10::IValue& b) {
  if (op == SymOp::kNeg) return a.isDouble() ? c10::IValue(-a.toDouble()) : c10::IValue(-a.toInt());
  if (a.isDouble() || b.isDouble()) {
    const double x = a.isDouble() ? a.toDouble() : static_cast<double>(a.toInt());
    const double y = b.isDouble() ? b.toDouble() : static_cast<double>(b.toInt());
    return arithmetic(op, x, y);
  }
  const int64_t x = a.isBool() ? a.toBool() : a.toInt(), y = b.isBool() ? b.toBool() : b.toInt();
  return arithmetic(op, x, y);
}

}  // namespace

c10::IValue number_from(const c10::IValue& v) {
  if (!v.isTensor()) return v;
  const at::Tensor& t = v.toTensor();
  TORCH_CHECK(t.dim() == 0, "a symbolic size arrived as a tensor of shape ", t.sizes());
  if (t.scalar_type() == at::kBool) return t.item<bool>();
  if (at::isFloatingType(t.scalar_type())) return t.item<double>();
  return t.item<int64_t>();
}

namespace {

c10::IValue argument(const Arg& arg, const std::vector<c10::IValue>& values, const RunContext& context) {
  switch (arg.kind) {
    case Arg::Kind::kConstant: return arg.constant;
    case Arg::Kind::kValue: return values[arg.slot];
    case Arg::Kind::kTensors: {
      c10::List<at::Tensor> list;
      list.reserve(arg.slots.size());
      for (int s : arg.slots) list.push_back(values[s].toTensor());
      return list;
    }
    case Arg::Kind::kOptionalTensors: {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(arg.slots.size());
      for (int s : arg.slots) list.push_back(s < 0 ? std::nullopt : std::optional<at::Tensor>(values[s].toTensor()));
      return list;
    }
    case Arg::Kind::kInts: {
      std::vector<int64_t> ints = arg.ints;
      for (size_t i = 0; i < ints.size(); ++i) {
        if (arg.slots[i] >= 0) ints[i] = number_from(values[arg.slots[i]]).toInt();
      }
      return c10::List<int64_t>(ints);
    }
    case Arg::Kind::kDevice: return context.device;
  }
  return {};
}

std::string where_of(const Node& node) {
  std::string s = "node '" + node.name + "' (" + (node.op ? node.op->schema().name() : node.target);
  if (!node.module_path.empty()) s += ", in module '" + node.module_path + "'";
  return s + ")";
}

void run_node(const Node& node, std::vector<c10::IValue>& values, const RunContext& context) {
  if (node.sym != SymOp::kNone) {
    const c10::IValue a = number_from(argument(node.args.at(0), values, context));
    const c10::IValue b = node.args.size() > 1 ? number_from(argument(node.args[1], values, context)) : c10::IValue();
    values[node.outs[0].slots[0]] = symbolic(node.sym, a, b);
    return;
  }
  if (!context.training && node.counts_batches) {
    values[node.outs.at(0).slots.at(0)] = values[node.args[0].slot];  // add_ returns its input
    return;
  }
  torch::jit::Stack stack;
  stack.reserve(node.args.size());
  for (size_t i = 0; i < node.args.size(); ++i) {
    stack.push_back(argument(node.args[i], values, context));
    if (!context.training && static_cast<int>(i) == node.training_arg) stack.back() = false;
  }
  node.op->callBoxed(stack);
  for (size_t i = 0; i < node.outs.size() && i < stack.size(); ++i) {
    const Out& out = node.outs[i];
    if (out.list) {
      const auto list = stack[i].toTensorVector();
      TORCH_CHECK(list.size() == out.slots.size(), "returned ", list.size(), " tensors where the graph names ",
                  out.slots.size());
      for (size_t j = 0; j < list.size(); ++j) values[out.slots[j]] = list[j];
    } else if (out.slots[0] >= 0) {
      values[out.slots[0]] = std::move(stack[i]);
    }
  }
}

}  // namespace

void run_nodes(const Program& program, size_t first, size_t last, std::vector<c10::IValue>& values,
               const RunContext& context) {
  for (size_t i = first; i < last; ++i) {
    const Node& node = program.nodes[i];
    try {
      run_node(node, values, context);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "conveyor: ", where_of(node), ": ", message_of(e));
    }
  }
}

}  // namespace conveyor::exported
