// Offloaded stashes (schedules::Stash::kOffload): after a forward, the
// entry's inputs are copied to pinned host memory on the stage's side stream;
// the action before their backward copies them back on the same stream, and
// the backward waits for that copy's event only. On the CPU nothing moves
// (the inputs already live in host memory): offloading is recomputation.
#include "plugin/runtime/runtime.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

namespace conveyor {

void Runtime::offload(int k, StashEntry& entry) {
  const std::optional<c10::Stream>& side = side_streams_[k];
  if (!side) return;  // on the CPU the stash already lives in host memory
  const c10::Stream compute = *streams_[k];
  c10::Event computed(compute.device_type());
  computed.record(compute);
  computed.block(*side);  // the copy reads what the forward wrote
  c10::StreamGuard on_side(*side);
  for (auto& t : entry.inputs) {
    if (!t.defined() || t.is_cpu()) continue;
    at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    host.copy_(t, /*non_blocking=*/true);
    t.record_stream(*side);  // its memory is reused only once the copy is done
    t = host;
  }
  entry.offloaded = true;
}

void Runtime::prefetch(int k, StashEntry& entry) {
  if (!entry.offloaded || entry.prefetched_ready) return;
  const c10::Stream side = *side_streams_[k];
  const c10::Stream compute = *streams_[k];
  const c10::Device device = stages_[k]->device();
  c10::StreamGuard on_side(side);
  entry.prefetched.assign(entry.inputs.size(), at::Tensor());
  for (size_t i = 0; i < entry.inputs.size(); ++i) {
    const at::Tensor& host = entry.inputs[i];
    if (!host.defined() || !host.is_pinned()) {
      entry.prefetched[i] = host;
      continue;
    }
    at::Tensor back = at::empty(host.sizes(), host.options().device(device).pinned_memory(false));
    back.copy_(host, /*non_blocking=*/true);
    back.record_stream(compute);  // allocated on the side stream, used on the compute stream
    entry.prefetched[i] = back;
  }
  entry.prefetched_ready.emplace(side.device_type());
  entry.prefetched_ready->record(side);
}

void Runtime::bring_back(int k, StashEntry& entry) {
  if (!entry.offloaded) return;
  prefetch(k, entry);  // a no-op when the action before has done it
  entry.prefetched_ready->block(*streams_[k]);
  entry.inputs = std::move(entry.prefetched);
  entry.prefetched.clear();
  entry.prefetched_ready.reset();
  entry.offloaded = false;
}

}  // namespace conveyor
