#pragma once
// Typed reads of a checkpoint's unpickled values (plugin/checkpoint/checkpoint.h)
// that refuse what a damaged or foreign file holds instead of trusting it: a
// missing key, a value of the wrong type, a tensor whose storage is too small
// for its shape, a random-generator state that does not fit. Each throws
// std::invalid_argument(what + "..."), naming the key.

#include <ATen/core/Dict.h>
#include <ATen/core/Generator.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

namespace conveyor::checked {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

// dict[key]; throws when the dict has no such (string) key.
const c10::IValue& field(const Dict& dict, const std::string& key, const std::string& what);
bool has(const Dict& dict, const std::string& key);
// A key that is present and not None.
bool has_value(const Dict& dict, const std::string& key);

int64_t to_int(const c10::IValue& v, const std::string& name, const std::string& what);
double to_double(const c10::IValue& v, const std::string& name, const std::string& what);  // an int too
bool to_bool(const c10::IValue& v, const std::string& name, const std::string& what);
std::string to_string(const c10::IValue& v, const std::string& name, const std::string& what);
List to_list(const c10::IValue& v, const std::string& name, const std::string& what);
// A dict whose keys are all strings.
Dict to_dict(const c10::IValue& v, const std::string& name, const std::string& what);
// A defined, dense CPU tensor of a real (floating or integral) type whose
// storage holds every element its sizes, strides and offset reach.
at::Tensor to_tensor(const c10::IValue& v, const std::string& name, const std::string& what);

int64_t int_field(const Dict& d, const std::string& key, const std::string& what);
List list_field(const Dict& d, const std::string& key, const std::string& what);
Dict dict_field(const Dict& d, const std::string& key, const std::string& what);
at::Tensor tensor_field(const Dict& d, const std::string& key, const std::string& what);

// `state` (a to_tensor) as a contiguous tensor that `gen` accepts as its state
// (checked on a copy of gen, which is left as it was); throws otherwise.
at::Tensor generator_state(const at::Generator& gen, const at::Tensor& state, const std::string& name,
                           const std::string& what);

}  // namespace conveyor::checked
