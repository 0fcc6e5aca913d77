#include "plugin/runtime/activation_stash.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace conveyor {

void ActivationStash::put(int mb, StashEntry entry) {
  bytes_ += entry.bytes;
  peak_bytes_ = std::max(peak_bytes_, bytes_);
  if (entry.inputs_only) {
    peak_inputs_ = std::max(peak_inputs_, ++inputs_);
  } else {
    peak_activations_ = std::max(peak_activations_, ++activations_);
  }
  entries_.insert_or_assign(mb, std::move(entry));
  peak_inflight_ = std::max(peak_inflight_, static_cast<int>(entries_.size()));
}

StashEntry ActivationStash::take(int mb) {
  auto it = entries_.find(mb);
  TORCH_CHECK(it != entries_.end(), "no stashed forward for micro-batch ", mb);
  StashEntry entry = std::move(it->second);
  entries_.erase(it);
  bytes_ -= entry.bytes;
  --(entry.inputs_only ? inputs_ : activations_);
  return entry;
}

StashEntry& ActivationStash::at(int mb) {
  StashEntry* entry = find(mb);
  TORCH_CHECK(entry != nullptr, "no stashed forward for micro-batch ", mb);
  return *entry;
}

StashEntry* ActivationStash::find(int mb) {
  auto it = entries_.find(mb);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace conveyor
