#include "plugin/core/option_values.h"

#include "plugin/core/options.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

namespace conveyor {

namespace {

std::string loss_scaling_fields() {
  std::string out;
  const LossScaling defaults;
  for_each_option(defaults, [&](const OptionSpec& spec, const auto&) {
    out += c10::str(out.empty() ? "" : ", ", spec.name);
  });
  return out;
}

// A whole string read as a number by `parse` (std::stoll, std::stod), or nullopt.
template <typename T, typename Parse>
std::optional<T> parse_whole(const std::string& text, Parse parse) {
  try {
    size_t used = 0;
    const T x = parse(text, &used);
    if (used == text.size()) return x;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::string python_type(const c10::IValue& v) {
  if (v.isString()) return "str";
  if (v.isBool()) return "bool";
  if (v.isInt()) return "int";
  if (v.isDouble()) return "float";
  if (v.isTensor()) return "Tensor";
  if (v.isNone()) return "None";
  if (v.isList()) return "list";
  if (v.isGenericDict()) return "dict";
  if (v.isTuple()) return "tuple";
  if (v.isObject()) return v.toObjectRef().type()->is_module() ? "ScriptModule" : "object";
  return v.tagKind();
}

std::string bad_value_text(const std::string& key, const std::string& expected, const c10::IValue& got) {
  std::string shown;
  if (got.isString()) {
    shown = c10::str(" '", got.toStringRef().substr(0, 80), "'");
  } else if (got.isInt() || got.isDouble() || got.isBool()) {
    shown = " " + python_repr(got);
  }
  return c10::str("conveyor.Pipeline: ", key, " must be ", expected, ", got ", python_type(got), shown);
}

OptionTypeError bad_type(const std::string& key, const std::string& expected, const c10::IValue& got) {
  return OptionTypeError(bad_value_text(key, expected, got));
}

std::invalid_argument bad_option(const std::string& key, const std::string& expected, const c10::IValue& got) {
  return std::invalid_argument(bad_value_text(key, expected, got));
}

int64_t as_int(const std::string& key, const c10::IValue& v, ValueText text) {
  if (v.isInt()) return v.toInt();
  // A TorchScript dict holds one value type: 2000.0 among floats is 2000.
  if (text == ValueText::kOrText && v.isDouble() && v.toDouble() == std::floor(v.toDouble())) {
    return static_cast<int64_t>(v.toDouble());
  }
  const auto stoll = [](const std::string& t, size_t* used) { return std::stoll(t, used); };
  if (text == ValueText::kOrText && v.isString()) {
    if (const auto n = parse_whole<int64_t>(v.toStringRef(), stoll)) return *n;
  }
  throw bad_type(key, "an int", v);
}

double as_double(const std::string& key, const c10::IValue& v, ValueText text) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isString() && (v.toStringRef() == "inf" || v.toStringRef() == "infinity")) {
    return std::numeric_limits<double>::infinity();
  }
  const auto stod = [](const std::string& t, size_t* used) { return std::stod(t, used); };
  if (text == ValueText::kOrText && v.isString()) {
    if (const auto x = parse_whole<double>(v.toStringRef(), stod)) return *x;
  }
  throw bad_type(key, "a number", v);
}

bool as_bool(const std::string& key, const c10::IValue& v, ValueText text) {
  if (v.isBool()) return v.toBool();
  if (text == ValueText::kOrText && v.isString() && (v.toStringRef() == "true" || v.toStringRef() == "false")) {
    return v.toStringRef() == "true";
  }
  throw bad_type(key, "True or False", v);
}

std::string as_string(const std::string& key, const c10::IValue& v) {
  if (!v.isString()) throw bad_type(key, "a str", v);
  return v.toStringRef();
}

std::vector<std::string> as_strings(const std::string& key, const c10::IValue& v) {
  std::vector<std::string> out;
  if (v.isString()) {
    std::istringstream in(v.toStringRef());
    for (std::string item; std::getline(in, item, ',');) {
      if (!item.empty()) out.push_back(item);
    }
    return out;
  }
  if (!v.isList() && !v.isTuple()) throw bad_type(key, "a list of str", v);
  const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  for (const c10::IValue& item : items) {
    if (!item.isString()) throw bad_type(key, "a list of str", item);
    out.push_back(item.toStringRef());
  }
  return out;
}

std::vector<int64_t> as_ints(const std::string& key, const c10::IValue& v, ValueText text) {
  if (!v.isList() && !v.isTuple()) throw bad_type(key, "a list of int", v);
  const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  std::vector<int64_t> out;
  for (const c10::IValue& item : items) {
    if (!item.isInt() && !(text == ValueText::kOrText && item.isString())) throw bad_type(key, "a list of int", item);
    out.push_back(as_int(key, item, text));
  }
  return out;
}

std::string choice_text(const char* const* names, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) out += c10::str(i == 0 ? "" : ", ", "'", names[i], "'");
  return out;
}

size_t as_choice(const std::string& key, const c10::IValue& v, const char* const* names, size_t count) {
  if (!v.isString()) throw bad_type(key, "a str, one of " + choice_text(names, count), v);
  for (size_t i = 0; i < count; ++i) {
    if (v.toStringRef() == names[i]) return i;
  }
  throw bad_option(key, "one of " + choice_text(names, count), v);
}

c10::ScalarType as_autocast_dtype(const std::string& key, const c10::IValue& v) {
  static const char* const names[] = {"bf16", "fp16", "bfloat16", "float16", "half"};
  const size_t i = as_choice(key, v, names, 5);
  return i == 0 || i == 2 ? at::kBFloat16 : at::kHalf;
}

std::vector<AtomicGroup> OptionValue<std::vector<AtomicGroup>>::read(const std::string& k, const c10::IValue& v,
                                                                     ValueText t) {
  std::vector<AtomicGroup> out;
  for (const auto& pair : OptionValue<std::vector<std::vector<int64_t>>>::read(k, v, t)) {
    if (pair.size() != 2) throw bad_option(k, "a list of (first, last) layer pairs", v);
    out.push_back(AtomicGroup{pair[0], pair[1]});
  }
  return out;
}

c10::IValue OptionValue<std::vector<AtomicGroup>>::write(const std::vector<AtomicGroup>& groups) {
  std::vector<std::vector<int64_t>> pairs;
  for (const AtomicGroup& g : groups) pairs.push_back({g.first, g.last});
  return OptionValue<std::vector<std::vector<int64_t>>>::write(pairs);
}

std::chrono::milliseconds OptionValue<std::chrono::milliseconds>::read(const std::string& k, const c10::IValue& v,
                                                                       ValueText t) {
  const double seconds = as_double(k, v, t);
  if (!(seconds > 0) || !std::isfinite(seconds)) throw bad_option(k, "a positive number of seconds", v);
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

std::optional<LossScaling> OptionValue<std::optional<LossScaling>>::read(const std::string& k, const c10::IValue& v,
                                                                         ValueText t) {
  if (v.isNone()) return std::nullopt;
  if (v.isBool() || (t == ValueText::kOrText && v.isString())) {
    return as_bool(k, v, t) ? std::optional<LossScaling>(LossScaling()) : std::nullopt;
  }
  if (!v.isGenericDict()) throw bad_type(k, "True, or a dict of " + loss_scaling_fields(), v);
  LossScaling scaling;
  for (const auto& entry : v.toGenericDict()) {
    const std::string field = entry.key().isString() ? entry.key().toStringRef() : "";
    if (!read_option(scaling, field, entry.value(), t, k + "['" + field + "']")) {
      throw std::invalid_argument("conveyor.Pipeline: unknown loss_scaling field '" + field + "' (known: " +
                                  loss_scaling_fields() + ")");
    }
  }
  return scaling;
}

c10::IValue OptionValue<std::optional<LossScaling>>::write(const std::optional<LossScaling>& scaling) {
  if (!scaling) return c10::IValue();
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for_each_option(*scaling, [&](const OptionSpec& spec, const auto& value) {
    out.insert(spec.name, OptionValue<std::decay_t<decltype(value)>>::write(value));
  });
  return out;
}

Tensors as_tensors(const char* what, const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  if (!v.isTuple() && !v.isList()) {
    throw std::invalid_argument(std::string("conveyor.Pipeline: the ") + what + " must be a tensor or a tuple of " +
                                "tensors, got " + python_type(v));
  }
  Tensors out;
  const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toList().vec();
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].isNone()) {
      out.emplace_back();
    } else if (items[i].isTensor()) {
      out.push_back(items[i].toTensor());
    } else {
      throw std::invalid_argument(c10::str("conveyor.Pipeline: element ", i, " of the ", what, " is a ",
                                           python_type(items[i]), ", not a tensor"));
    }
  }
  return out;
}

std::string python_repr(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) {
    const double x = v.toDouble();
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    std::ostringstream out;
    out.precision(17);
    out << x;
    std::string text = out.str();
    return text.find_first_of(".e") == std::string::npos ? text + ".0" : text;
  }
  if (v.isString()) return "'" + v.toStringRef() + "'";
  if (v.isList()) {
    std::string out = "[";
    for (const c10::IValue& item : v.toListRef()) out += (out.size() > 1 ? ", " : "") + python_repr(item);
    return out + "]";
  }
  if (v.isGenericDict()) {
    std::string out = "{";
    for (const auto& entry : v.toGenericDict()) {
      out += (out.size() > 1 ? ", " : "") + python_repr(entry.key()) + ": " + python_repr(entry.value());
    }
    return out + "}";
  }
  return v.tagKind();
}

}  // namespace conveyor
