#pragma once
// How the rows of plugin/core/option_list.h are read: each row's bound and what it
// asks in words, the row as generated code sees it (OptionSpec), and the
// macros that make a row a builder method and visit every row of a list.

#include <c10/util/StringUtil.h>
#include <torch/arg.h>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace conveyor {

// The values a number may take: from `minimum` (strict: above it) to
// `maximum` (strict_maximum: below it; an infinite maximum, strict, excludes
// infinity). NaN is outside every bound but kAny.
struct Bound {
  double minimum = -std::numeric_limits<double>::infinity();
  bool strict = false;
  double maximum = std::numeric_limits<double>::infinity();
  bool strict_maximum = false;
};
inline constexpr Bound kAny{};
inline constexpr Bound kPositive{0, true};
constexpr Bound at_least(double minimum) { return Bound{minimum, false}; }
constexpr Bound more_than(double minimum) { return Bound{minimum, true}; }
// Finite and at least `minimum` (strict: above it).
constexpr Bound finite(Bound lower) {
  return Bound{lower.minimum, lower.strict, std::numeric_limits<double>::infinity(), true};
}
// Strictly between the two.
constexpr Bound open_interval(double low, double high) { return Bound{low, true, high, true}; }

// One row, as the code generated from it sees it.
struct OptionSpec {
  const char* section;
  const char* name;
  const char* doc;
  Bound bound;
};

// What `bound` asks in words: "at least 1", "positive", "in (0, 1)", "positive and finite".
inline std::string bound_text(const Bound& bound) {
  const double inf = std::numeric_limits<double>::infinity();
  if (bound.minimum > -inf && bound.maximum < inf) {
    return c10::str("in ", bound.strict ? "(" : "[", bound.minimum, ", ", bound.maximum,
                    bound.strict_maximum ? ")" : "]");
  }
  std::string text = bound.strict && bound.minimum == 0
                         ? std::string("positive")
                         : c10::str(bound.strict ? "more than " : "at least ", bound.minimum);
  if (bound.maximum == inf && bound.strict_maximum) text += " and finite";
  return text;
}

// Throws std::invalid_argument naming `spec`'s option when `value` (a number
// or a duration) is outside its bound; other types have none.
template <typename T>
void check_bound(const OptionSpec& spec, const T& value) {
  double x = 0;
  std::string shown;
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    x = static_cast<double>(value);
    shown = c10::str(value);
  } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
    x = static_cast<double>(value.count());
    shown = c10::str(value.count(), " ms");
  } else {
    return;
  }
  const Bound& b = spec.bound;
  const bool inside = (b.strict ? x > b.minimum : x >= b.minimum) &&
                      (b.strict_maximum ? x < b.maximum : x <= b.maximum);  // NaN: outside
  if (!inside) {
    throw std::invalid_argument(
        c10::str("conveyor: ", spec.name, " must be ", bound_text(spec.bound), ", got ", shown));
  }
}

#define CONVEYOR_OPTION_ARG(section, Type, name, default_, bound, doc) TORCH_ARG(Type, name) = default_;
#define CONVEYOR_OPTION_VISIT(section, Type, name, default_, bound, doc) \
  visit(::conveyor::OptionSpec{#section, #name, doc, bound}, options.name());

// for_each_option(options, visit): visit(spec, value) for every row of
// `LIST`, in order, with a reference to the option's value in `options` (a
// Struct, const or not, with a getter per row: options.name()).
#define CONVEYOR_FOR_EACH_OPTION(Struct, LIST)                         \
  template <typename Options, typename Visit>                          \
    requires std::is_same_v<std::remove_const_t<Options>, Struct>      \
  void for_each_option(Options& options, Visit&& visit) {              \
    LIST(CONVEYOR_OPTION_VISIT)                                        \
  }

// Every option of `options` (a struct with for_each_option) within its row's
// bound, those of a section it holds (an optional LossScaling) included, or
// std::invalid_argument naming the first that is not.
template <typename Options>
void check_bounds(const Options& options) {
  for_each_option(options, [](const OptionSpec& spec, const auto& value) {
    if constexpr (requires { for_each_option(*value, [](const OptionSpec&, const auto&) {}); }) {
      if (value) check_bounds(*value);
    } else {
      check_bound(spec, value);
    }
  });
}

}  // namespace conveyor
