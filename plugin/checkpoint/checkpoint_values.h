#pragma once
// What the checkpoint's writers and readers share: empty containers of the
// types a checkpoint holds, and the labels its errors give optimizers.

#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/StringUtil.h>

#include <cstddef>
#include <string>

namespace conveyor::checkpoint_values {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

inline Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
inline List new_list() { return List(c10::AnyType::get()); }
// A tensor as a checkpoint stores it: detached, on the CPU.
inline at::Tensor to_cpu(const at::Tensor& t) { return t.detach().to(at::kCPU); }

// A caller's optimizer, by its index; a stage's own one.
inline std::string optimizer_label(size_t i) { return c10::str("optimizer ", i); }
inline std::string stage_optimizer_label(int k) { return c10::str("stage ", k, "'s optimizer"); }

}  // namespace conveyor::checkpoint_values
