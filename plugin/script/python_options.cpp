#include "plugin/script/python_options.h"

#include <c10/util/StringUtil.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <optional>
#include <sstream>

namespace conveyor {

namespace {

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

std::invalid_argument bad_option(const std::string& key, const std::string& expected, const c10::IValue& got) {
  const std::string text = got.isString() ? c10::str(" '", got.toStringRef(), "'") : "";
  return std::invalid_argument(
      c10::str("conveyor.Pipeline: option '", key, "' must be ", expected, ", got ", python_type(got), text));
}

int64_t as_int(const std::string& key, const c10::IValue& v) {
  if (v.isInt()) return v.toInt();
  const auto stoll = [](const std::string& t, size_t* used) { return std::stoll(t, used); };
  if (v.isString()) {
    if (const auto n = parse_whole<int64_t>(v.toStringRef(), stoll)) return *n;
  }
  throw bad_option(key, "an int", v);
}

double as_double(const std::string& key, const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  const auto stod = [](const std::string& t, size_t* used) { return std::stod(t, used); };
  if (v.isString()) {
    if (const auto x = parse_whole<double>(v.toStringRef(), stod)) return *x;
  }
  throw bad_option(key, "a float", v);
}

bool as_bool(const std::string& key, const c10::IValue& v) {
  if (v.isBool()) return v.toBool();
  if (v.isString() && (v.toStringRef() == "true" || v.toStringRef() == "false")) return v.toStringRef() == "true";
  throw bad_option(key, "a bool", v);
}

std::string as_string(const std::string& key, const c10::IValue& v) {
  if (!v.isString()) throw bad_option(key, "a str", v);
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
  if (!v.isList()) throw bad_option(key, "a list of str or a comma-separated str", v);
  for (const c10::IValue& item : v.toListRef()) out.push_back(as_string(key, item));
  return out;
}

OptimizerFactory optimizer_from(const PythonOptions& options) {
  const auto get = [&](const char* key, double fallback) {
    return options.contains(key) ? as_double(key, options.at(key)) : fallback;
  };
  if (!options.contains("optimizer")) {
    for (const char* key : {"lr", "momentum", "weight_decay"}) {
      if (options.contains(key)) {
        throw std::invalid_argument(std::string("conveyor.Pipeline: option '") + key +
                                    "' sets the pipeline's own optimizer: give 'optimizer' too (or step a torch.optim "
                                    "optimizer over parameters() yourself)");
      }
    }
    return nullptr;
  }
  const std::string name = as_string("optimizer", options.at("optimizer"));
  if (!options.contains("lr")) throw std::invalid_argument("conveyor.Pipeline: option 'optimizer' needs 'lr'");
  const double lr = get("lr", 0), momentum = get("momentum", 0);
  const double weight_decay = get("weight_decay", name == "adamw" ? 1e-2 : 0.0);  // torch.optim's defaults
  if (name == "sgd") {
    return [=](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::SGD>(
          p, torch::optim::SGDOptions(lr).momentum(momentum).weight_decay(weight_decay));
    };
  }
  if (options.contains("momentum")) {
    throw std::invalid_argument("conveyor.Pipeline: option 'momentum' is for optimizer 'sgd', not '" + name + "'");
  }
  if (name == "adam") {
    return [=](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr).weight_decay(weight_decay));
    };
  }
  if (name == "adamw") {
    return [=](std::vector<at::Tensor> p) {
      return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
    };
  }
  throw bad_option("optimizer", "\"sgd\", \"adam\" or \"adamw\"", options.at("optimizer"));
}

std::vector<int64_t> as_ints(const std::string& key, const c10::IValue& v) {
  if (!v.isList()) throw bad_option(key, "a list of int", v);
  std::vector<int64_t> out;
  for (const c10::IValue& item : v.toListRef()) out.push_back(as_int(key, item));
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

}  // namespace conveyor
