#pragma once
// Options as Python hands them over: each option's value read from, and
// written to, an IValue (what a Python keyword or the TorchScript class's
// dict holds), by its C++ type; the option lists' rows (plugin/core/option_list.h)
// say which type each option has. A value of the wrong type is an
// OptionTypeError (Python's TypeError), a value outside the allowed ones a
// std::invalid_argument (ValueError), each naming the option.

#include "ops/adapters.h"
#include "plugin/core/errors.h"
#include "plugin/core/option_list.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/StringUtil.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace conveyor {

using PythonOptions = c10::Dict<std::string, c10::IValue>;

// Python's name for what a value is, for messages.
std::string python_type(const c10::IValue& v);
// "conveyor.Pipeline: <key> must be <expected>, got <type> <value>".
std::string bad_value_text(const std::string& key, const std::string& expected, const c10::IValue& got);
OptionTypeError bad_type(const std::string& key, const std::string& expected, const c10::IValue& got);
std::invalid_argument bad_option(const std::string& key, const std::string& expected, const c10::IValue& got);

// How values are read. kTyped: each of its own type (the conveyor package's
// keywords). kOrText: numbers and bools may also come as strings (the
// TorchScript class's dict, often built from command lines).
enum class ValueText { kTyped, kOrText };

int64_t as_int(const std::string& key, const c10::IValue& v, ValueText text);
double as_double(const std::string& key, const c10::IValue& v, ValueText text);
bool as_bool(const std::string& key, const c10::IValue& v, ValueText text);
std::string as_string(const std::string& key, const c10::IValue& v);
// A list of str, or one comma-separated str.
std::vector<std::string> as_strings(const std::string& key, const c10::IValue& v);
std::vector<int64_t> as_ints(const std::string& key, const c10::IValue& v, ValueText text);
c10::ScalarType as_autocast_dtype(const std::string& key, const c10::IValue& v);

// A tensor, or a tuple or list of tensors (None for an empty slot); `what`
// ("input", "target") names it in errors.
Tensors as_tensors(const char* what, const c10::IValue& v);

// The name in `names` that `v` spells, as its index (a std::invalid_argument
// listing them otherwise).
size_t as_choice(const std::string& key, const c10::IValue& v, const char* const* names, size_t count);
// "'a', 'b' or 'c'".
std::string choice_text(const char* const* names, size_t count);

template <typename T>
concept NamedEnum = std::is_enum_v<T> && requires(T t) { value_names(t); };

// OptionValue<T>: how an option of type T is read, written and described
// to Python. `reachable` is false for what only C++ can give (a factory, a
// profile); `type` is its Python annotation.
template <typename T, typename = void>
struct OptionValue {
  static constexpr bool reachable = false;
};

template <>
struct OptionValue<bool> {
  static constexpr bool reachable = true;
  static std::string type() { return "bool"; }
  static bool read(const std::string& k, const c10::IValue& v, ValueText t) { return as_bool(k, v, t); }
  static c10::IValue write(bool b) { return b; }
};

template <typename T>
struct OptionValue<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static constexpr bool reachable = true;
  static std::string type() { return "int"; }
  static T read(const std::string& k, const c10::IValue& v, ValueText t) { return static_cast<T>(as_int(k, v, t)); }
  static c10::IValue write(T n) { return static_cast<int64_t>(n); }
};

template <>
struct OptionValue<double> {
  static constexpr bool reachable = true;
  static std::string type() { return "float"; }
  static double read(const std::string& k, const c10::IValue& v, ValueText t) { return as_double(k, v, t); }
  static c10::IValue write(double x) { return x; }
};

template <>
struct OptionValue<std::string> {
  static constexpr bool reachable = true;
  static std::string type() { return "str"; }
  static std::string read(const std::string& k, const c10::IValue& v, ValueText) { return as_string(k, v); }
  static c10::IValue write(const std::string& s) { return s; }
};

template <>
struct OptionValue<std::vector<std::string>> {
  static constexpr bool reachable = true;
  static std::string type() { return "list[str]"; }
  static std::vector<std::string> read(const std::string& k, const c10::IValue& v, ValueText) {
    return as_strings(k, v);
  }
  static c10::IValue write(const std::vector<std::string>& s) { return c10::List<std::string>(s); }
};

template <>
struct OptionValue<std::vector<int64_t>> {
  static constexpr bool reachable = true;
  static std::string type() { return "list[int]"; }
  static std::vector<int64_t> read(const std::string& k, const c10::IValue& v, ValueText t) { return as_ints(k, v, t); }
  static c10::IValue write(const std::vector<int64_t>& s) { return c10::List<int64_t>(s); }
};

template <typename Item>
struct OptionValue<std::vector<std::vector<Item>>, std::enable_if_t<OptionValue<std::vector<Item>>::reachable>> {
  static constexpr bool reachable = true;
  static std::string type() { return "list[" + OptionValue<std::vector<Item>>::type() + "]"; }
  static std::vector<std::vector<Item>> read(const std::string& k, const c10::IValue& v, ValueText t) {
    if (!v.isList()) throw bad_type(k, "a list of lists", v);
    std::vector<std::vector<Item>> out;
    for (const c10::IValue& group : v.toListRef()) out.push_back(OptionValue<std::vector<Item>>::read(k, group, t));
    return out;
  }
  static c10::IValue write(const std::vector<std::vector<Item>>& groups) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& g : groups) out.push_back(OptionValue<std::vector<Item>>::write(g));
    return out;
  }
};

template <>
struct OptionValue<std::vector<AtomicGroup>> {
  static constexpr bool reachable = true;
  static std::string type() { return "list[tuple[int, int]]"; }
  static std::vector<AtomicGroup> read(const std::string& k, const c10::IValue& v, ValueText t);
  static c10::IValue write(const std::vector<AtomicGroup>& groups);
};

// A duration: seconds, as Python's timeouts are.
template <>
struct OptionValue<std::chrono::milliseconds> {
  static constexpr bool reachable = true;
  static std::string type() { return "float"; }
  static std::chrono::milliseconds read(const std::string& k, const c10::IValue& v, ValueText t);
  static c10::IValue write(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }
};

template <NamedEnum E>
struct OptionValue<E> {
  static constexpr bool reachable = true;
  static std::string type() { return "str"; }
  static E read(const std::string& k, const c10::IValue& v, ValueText) {
    const auto names = value_names(E{});
    return static_cast<E>(as_choice(k, v, names.data(), names.size()));
  }
  static c10::IValue write(E e) { return std::string(value_name(e)); }
};

template <>
struct OptionValue<c10::ScalarType> {
  static constexpr bool reachable = true;
  static std::string type() { return "str | torch.dtype"; }
  static c10::ScalarType read(const std::string& k, const c10::IValue& v, ValueText) {
    return as_autocast_dtype(k, v);
  }
  static c10::IValue write(c10::ScalarType d) { return std::string(d == at::kHalf ? "fp16" : "bf16"); }
};

template <>
struct OptionValue<std::optional<LossScaling>> {
  static constexpr bool reachable = true;
  static std::string type() { return "bool | dict | None"; }
  static std::optional<LossScaling> read(const std::string& k, const c10::IValue& v, ValueText t);
  static c10::IValue write(const std::optional<LossScaling>& scaling);
};

// The pipeline's optimizer: None, or a name; a C++ factory shows as the
// string "<factory>", which no read accepts.
template <>
struct OptionValue<OptimizerSpec> {
  static constexpr bool reachable = true;
  static std::string type() { return "str | None"; }
  static OptimizerSpec read(const std::string& k, const c10::IValue& v, ValueText t) {
    if (v.isNone()) return {};
    return OptionValue<OptimizerName>::read(k, v, t);
  }
  static c10::IValue write(const OptimizerSpec& spec) {
    if (spec.name) return OptionValue<OptimizerName>::write(*spec.name);
    return spec.factory ? c10::IValue(std::string("<factory>")) : c10::IValue();
  }
};

// Any other optional value: None, or the value.
template <typename T>
struct OptionValue<std::optional<T>, std::enable_if_t<OptionValue<T>::reachable>> {
  static constexpr bool reachable = true;
  static std::string type() { return OptionValue<T>::type() + " | None"; }
  static std::optional<T> read(const std::string& k, const c10::IValue& v, ValueText t) {
    if (v.isNone()) return std::nullopt;
    return OptionValue<T>::read(k, v, t);
  }
  static c10::IValue write(const std::optional<T>& value) {
    return value ? OptionValue<T>::write(*value) : c10::IValue();
  }
};

// The values an enumeration's option takes, as Python spells them; empty for others.
template <typename T>
std::vector<std::string> option_choices() {
  if constexpr (NamedEnum<T>) {
    const auto names = value_names(T{});
    return std::vector<std::string>(names.begin(), names.end());
  } else if constexpr (std::is_same_v<T, OptimizerSpec>) {
    return option_choices<OptimizerName>();
  } else if constexpr (requires { typename T::value_type; }) {
    if constexpr (NamedEnum<typename T::value_type>) return option_choices<typename T::value_type>();
    return {};
  } else {
    return {};
  }
}

// Sets `options`' option `key` (any option struct with for_each_option) to
// `v`, None meaning its default; false when the struct has no option of that
// name that Python can give. Errors name the option `shown` ("" : key).
template <typename Options>
bool read_option(Options& options, const std::string& key, const c10::IValue& v, ValueText text,
                 const std::string& shown = "") {
  bool found = false;
  for_each_option(options, [&](const OptionSpec& spec, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if constexpr (OptionValue<T>::reachable) {
      if (!found && key == spec.name) {
        if (!v.isNone()) field = OptionValue<T>::read(shown.empty() ? key : shown, v, text);
        found = true;
      }
    }
  });
  return found;
}

// One row as Python describes it (conveyor._C.option_table()).
struct OptionDescription {
  std::string section, name, type, doc, bound;  // type empty: C++ only; bound empty: none
  c10::IValue default_value;
  std::vector<std::string> choices;
};

// Every row of `options`' lists, with `options`' values as the defaults.
template <typename Options>
void describe_options(const Options& options, std::vector<OptionDescription>& out) {
  for_each_option(options, [&](const OptionSpec& spec, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    OptionDescription d{spec.section, spec.name, "", spec.doc, "", {}, option_choices<T>()};
    if (spec.bound.minimum > -std::numeric_limits<double>::infinity()) d.bound = bound_text(spec.bound);
    if constexpr (OptionValue<T>::reachable) {
      d.type = OptionValue<T>::type();
      d.default_value = OptionValue<T>::write(value);
    }
    out.push_back(std::move(d));
  });
}

// A value as Python's repr() shows it: None, True, 2.0, '1f1b', [1, 2].
std::string python_repr(const c10::IValue& v);

}  // namespace conveyor
