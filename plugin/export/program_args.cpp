#include "plugin/export/program_args.h"

#include <ATen/ScalarOps.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

namespace conveyor::exported {

namespace ser = torch::_export;

namespace {

c10::TypePtr unwrapped(const c10::TypePtr& type) {
  if (const auto opt = type->cast<c10::OptionalType>()) return opt->getElementType();
  return type;
}

bool wants_float(const c10::Argument& sa) {
  const auto type = unwrapped(sa.real_type());
  return type->kind() == c10::TypeKind::FloatType;
}

bool wants_float_list(const c10::Argument& sa) {
  const auto list = unwrapped(sa.real_type())->cast<c10::ListType>();
  return list && unwrapped(list->getElementType())->kind() == c10::TypeKind::FloatType;
}

c10::ScalarType scalar_type_of(ser::ScalarType t, const std::string& what) {
  static const std::map<ser::ScalarType, c10::ScalarType> types = {
      {ser::ScalarType::BYTE, at::kByte},         {ser::ScalarType::CHAR, at::kChar},
      {ser::ScalarType::SHORT, at::kShort},       {ser::ScalarType::INT, at::kInt},
      {ser::ScalarType::LONG, at::kLong},         {ser::ScalarType::HALF, at::kHalf},
      {ser::ScalarType::FLOAT, at::kFloat},       {ser::ScalarType::DOUBLE, at::kDouble},
      {ser::ScalarType::COMPLEXHALF, at::kComplexHalf}, {ser::ScalarType::COMPLEXFLOAT, at::kComplexFloat},
      {ser::ScalarType::COMPLEXDOUBLE, at::kComplexDouble}, {ser::ScalarType::BOOL, at::kBool},
      {ser::ScalarType::BFLOAT16, at::kBFloat16}, {ser::ScalarType::UINT16, at::kUInt16},
      // By number: torch 2.11's schema does not yet name UINT32 (34) and UINT64 (35).
      {static_cast<ser::ScalarType>(34), at::kUInt32}, {static_cast<ser::ScalarType>(35), at::kUInt64},
      {ser::ScalarType::FLOAT8E4M3FN, at::kFloat8_e4m3fn}, {ser::ScalarType::FLOAT8E5M2, at::kFloat8_e5m2}};
  const auto it = types.find(t);
  if (it == types.end()) {
    throw std::invalid_argument(what + " is a dtype this build does not know (" + std::string(printEnum(t)) + ")");
  }
  return it->second;
}

c10::Layout layout_of(ser::Layout l, const std::string& what) {
  switch (l) {
    case ser::Layout::Strided: return c10::kStrided;
    case ser::Layout::SparseCoo: return c10::kSparse;
    case ser::Layout::SparseCsr: return c10::kSparseCsr;
    case ser::Layout::SparseCsc: return c10::kSparseCsc;
    case ser::Layout::SparseBsr: return c10::kSparseBsr;
    case ser::Layout::SparseBsc: return c10::kSparseBsc;
    case ser::Layout::_mkldnn: return c10::kMkldnn;
    default: throw std::invalid_argument(what + " is an unknown layout");
  }
}

c10::MemoryFormat memory_format_of(ser::MemoryFormat f, const std::string& what) {
  switch (f) {
    case ser::MemoryFormat::ContiguousFormat: return c10::MemoryFormat::Contiguous;
    case ser::MemoryFormat::ChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case ser::MemoryFormat::ChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
    case ser::MemoryFormat::PreserveFormat: return c10::MemoryFormat::Preserve;
    default: throw std::invalid_argument(what + " is an unknown memory format");
  }
}

}  // namespace

std::string tag_name(const ser::Argument& a) {
  std::string name(printEnum(a.tag()));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

c10::OperatorHandle find_operator(const std::string& target, const std::string& who, const std::string& where) {
  const std::string prefix = "torch.ops.";
  if (target.rfind("torch.ops.higher_order.", 0) == 0) {
    throw std::invalid_argument(where + ": " + who + " is a higher-order operator (control flow such as cond or " +
                                "while_loop, or a wrapped subgraph), which the interpreter does not run");
  }
  if (target.rfind(prefix, 0) != 0) {
    throw std::invalid_argument(where + ": " + who + " calls a Python function, which the interpreter cannot run " +
                                "(only operators, and the arithmetic of symbolic sizes)");
  }
  const std::string rest = target.substr(prefix.size());
  const size_t dot1 = rest.find('.'), dot2 = rest.rfind('.');
  if (dot1 == std::string::npos || dot2 == dot1) {
    throw std::invalid_argument(where + ": " + who + " names no operator (namespace.name.overload)");
  }
  const std::string name = rest.substr(0, dot1) + "::" + rest.substr(dot1 + 1, dot2 - dot1 - 1);
  const std::string overload = rest.substr(dot2 + 1);
  const auto op = c10::Dispatcher::singleton().findSchema({name, overload == "default" ? "" : overload});
  if (!op) {
    throw std::invalid_argument(where + ": " + who + " calls " + name + (overload == "default" ? "" : "." + overload) +
                                ", an operator no library loaded in this process defines (load the library that "
                                "registers it before loading the program)");
  }
  return *op;
}

bool wants_optional_tensors(const c10::Argument& sa) {
  const auto list = unwrapped(sa.real_type())->cast<c10::ListType>();
  return list && list->getElementType()->cast<c10::OptionalType>() != nullptr;
}

c10::IValue number_for(const c10::Argument& sa, double as_float, int64_t as_int) {
  if (wants_float(sa)) return as_float;
  if (unwrapped(sa.real_type())->kind() == c10::TypeKind::TensorType) {
    // A Python number where the operator takes a tensor (add_(x, 1)): what
    // eager PyTorch passes, a wrapped number.
    at::Tensor t = at::scalar_to_tensor(as_float == static_cast<double>(as_int) ? c10::Scalar(as_int)
                                                                                 : c10::Scalar(as_float));
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }
  return as_int;
}

c10::IValue device_of(const ser::Device& d) {
  const auto index = d.get_index();
  return c10::Device(d.get_type() + (index ? ":" + std::to_string(*index) : std::string()));
}

c10::IValue constant_of(const ser::Argument& a, const c10::Argument& sa, const std::string& what,
                        const std::string& where) {
  using Tag = ser::Argument::Tag;
  switch (a.tag()) {
    case Tag::AS_INT: return number_for(sa, static_cast<double>(a.get_as_int()), a.get_as_int());
    case Tag::AS_INTS:
      if (wants_float_list(sa)) {
        return c10::List<double>(std::vector<double>(a.get_as_ints().begin(), a.get_as_ints().end()));
      }
      return c10::List<int64_t>(a.get_as_ints());
    case Tag::AS_FLOAT: {
      const double v = a.get_as_float().get();
      if (unwrapped(sa.real_type())->kind() != c10::TypeKind::TensorType) return v;
      at::Tensor t = at::scalar_to_tensor(c10::Scalar(v));
      t.unsafeGetTensorImpl()->set_wrapped_number(true);
      return t;
    }
    case Tag::AS_FLOATS: {
      std::vector<double> values;
      for (const auto& f : a.get_as_floats()) values.push_back(f.get());
      return c10::List<double>(values);
    }
    case Tag::AS_BOOL: return a.get_as_bool();
    case Tag::AS_BOOLS: {
      c10::List<bool> values;
      for (bool b : a.get_as_bools()) values.push_back(b);
      return values;
    }
    case Tag::AS_STRING: return a.get_as_string();
    case Tag::AS_STRINGS: return c10::List<std::string>(a.get_as_strings());
    case Tag::AS_SCALAR_TYPE: return scalar_type_of(a.get_as_scalar_type(), what);
    case Tag::AS_LAYOUT: return layout_of(a.get_as_layout(), what);
    case Tag::AS_MEMORY_FORMAT: return memory_format_of(a.get_as_memory_format(), what);
    default:
      throw std::invalid_argument(where + ": " + what + " is of kind " + tag_name(a) +
                                  ", which the interpreter does not read");
  }
}

bool training_argument(const c10::OperatorName& op, const std::string& arg) {
  static const std::map<std::string, std::string> flags = {
      {"aten::dropout", "train"},
      {"aten::feature_dropout", "train"},
      {"aten::alpha_dropout", "train"},
      {"aten::feature_alpha_dropout", "train"},
      {"aten::native_dropout", "train"},
      {"aten::batch_norm", "training"},
      {"aten::_native_batch_norm_legit", "training"},
      {"aten::_native_batch_norm_legit_functional", "training"},
      {"aten::_batch_norm_with_update", "training"}};
  const auto it = flags.find(op.name);
  return it != flags.end() && it->second == arg;
}

}  // namespace conveyor::exported
