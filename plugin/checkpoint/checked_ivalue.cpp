#include "plugin/checkpoint/checked_ivalue.h"

#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>

#include <mutex>
#include <stdexcept>

namespace conveyor::checked {

namespace {

[[noreturn]] void refuse(const std::string& what, const std::string& name, const std::string& problem) {
  throw std::invalid_argument(what + "'" + name + "' " + problem);
}

std::string type_of(const c10::IValue& v) { return v.tagKind(); }

}  // namespace

bool has(const Dict& dict, const std::string& key) { return dict.contains(c10::IValue(key)); }

bool has_value(const Dict& dict, const std::string& key) { return has(dict, key) && !dict.at(key).isNone(); }

const c10::IValue& field(const Dict& dict, const std::string& key, const std::string& what) {
  const auto it = dict.find(c10::IValue(key));
  if (it == dict.end()) refuse(what, key, "is missing");
  return it->value();
}

int64_t to_int(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isInt()) refuse(what, name, "is a " + type_of(v) + ", not an integer");
  return v.toInt();
}

double to_double(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (!v.isDouble()) refuse(what, name, "is a " + type_of(v) + ", not a number");
  return v.toDouble();
}

bool to_bool(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isBool()) refuse(what, name, "is a " + type_of(v) + ", not a bool");
  return v.toBool();
}

std::string to_string(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isString()) refuse(what, name, "is a " + type_of(v) + ", not a string");
  return v.toStringRef();
}

List to_list(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isList()) refuse(what, name, "is a " + type_of(v) + ", not a list");
  return v.toList();
}

Dict to_dict(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isGenericDict()) refuse(what, name, "is a " + type_of(v) + ", not a dict");
  Dict d = v.toGenericDict();
  for (const auto& entry : d) {
    if (!entry.key().isString()) refuse(what, name, "has a key that is a " + type_of(entry.key()) + ", not a string");
  }
  return d;
}

at::Tensor to_tensor(const c10::IValue& v, const std::string& name, const std::string& what) {
  if (!v.isTensor()) refuse(what, name, "is a " + type_of(v) + ", not a tensor");
  at::Tensor t = v.toTensor();
  if (!t.defined()) refuse(what, name, "is an undefined tensor");
  if (t.layout() != at::kStrided || t.is_quantized() || !t.device().is_cpu() || !t.has_storage()) {
    refuse(what, name, "is not a dense CPU tensor");
  }
  const c10::ScalarType type = t.scalar_type();
  if (!c10::isFloatingType(type) && !c10::isIntegralType(type, /*includeBool=*/true)) {
    refuse(what, name, std::string("has element type ") + c10::toString(type) + ", not a real number type");
  }
  // The last element its sizes and strides reach must lie in its storage.
  int64_t last = t.storage_offset();
  bool empty = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) < 0 || t.stride(d) < 0) refuse(what, name, "has a negative size or stride");
    empty = empty || t.size(d) == 0;
  }
  if (last < 0) refuse(what, name, "has a negative storage offset");
  if (empty) return t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) || __builtin_add_overflow(last, reach, &last)) {
      refuse(what, name, "has sizes and strides that overflow");
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(last) + 1, static_cast<uint64_t>(t.element_size()), &bytes) ||
      bytes > t.storage().nbytes()) {
    refuse(what, name,
           c10::str("of shape ", t.sizes(), " reaches past the end of its storage (", t.storage().nbytes(), " bytes)"));
  }
  return t;
}

int64_t int_field(const Dict& d, const std::string& key, const std::string& what) {
  return to_int(field(d, key, what), key, what);
}

List list_field(const Dict& d, const std::string& key, const std::string& what) {
  return to_list(field(d, key, what), key, what);
}

Dict dict_field(const Dict& d, const std::string& key, const std::string& what) {
  return to_dict(field(d, key, what), key, what);
}

at::Tensor tensor_field(const Dict& d, const std::string& key, const std::string& what) {
  return to_tensor(field(d, key, what), key, what);
}

at::Tensor generator_state(const at::Generator& gen, const at::Tensor& state, const std::string& name,
                           const std::string& what) {
  at::Generator copy;
  {
    at::Generator shared = gen;
    const std::lock_guard<std::mutex> lock(shared.mutex());
    copy = shared.clone();
  }
  // Its size first: a tensor of stride 0 may reach few bytes and have many elements.
  if (state.numel() != copy.get_state().numel()) {
    refuse(what, name,
           c10::str("has ", state.numel(), " elements, a ", gen.device().str(), " random generator's state ",
                    copy.get_state().numel()));
  }
  const at::Tensor contiguous = state.contiguous();
  try {
    copy.set_state(contiguous);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    refuse(what, name, "is not a state of a " + gen.device().str() + " random generator (" + reason + ")");
  }
  return contiguous;
}

}  // namespace conveyor::checked
