#pragma once
// The order between the caller's thread and the workers' streams on an
// accelerator. Each worker computes on a stream of its own (runtime.cpp);
// the caller's thread works on its current stream: a torch.optim step
// between two steps, the pipeline's own update after a synchronous step,
// the rollback's copies of the weights (an asynchronous schedule's version
// 0), tied copies refreshed, a checkpoint loaded, the inputs moved to the
// device. A pool stream does not wait for the caller's stream, nor the
// caller's for a pool stream, and with stages on several devices nothing
// relates one device's streams to another's. So every run is fenced by
// construction, with events, never a device-wide synchronize:
//   start: after everything the caller's thread does before the workers
//          run, each worker stream waits for an event recorded on the
//          caller's current stream of its device (one event a device);
//   end:   each worker records an event on its stream after its last
//          action, and the caller's current stream of that device waits
//          for it before run() returns (the update, a rollback and what
//          the caller queues next come after every worker's work).
// Tensors handed from one stream to another inside a step are recorded on
// the consuming stream by the transport (plugin/transport/in_process.cpp).
// Internal to the runtime.

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <optional>
#include <vector>

namespace conveyor {

// The device whose streams order a worker's work: its stages' device on an
// accelerator, none on the CPU (the CPU has no streams to order).
std::optional<c10::Device> stream_device(const c10::Device& stage_device, int worker);

// The start fence: each of `worker_streams` waits for what the calling
// thread's current stream of its device has queued so far.
void workers_wait_for_caller(const std::vector<std::optional<c10::Stream>>& worker_streams);

// The end fence, on a worker's thread after its last action: an event on
// `stream` for the caller to wait for.
c10::Event worker_finished(const c10::Stream& stream);

// The end fence, on the caller's thread once the workers have returned: its
// current stream of each event's device waits for the event.
void caller_waits_for(const std::vector<std::optional<c10::Event>>& finished);

namespace testing {
// Tests only: maps each worker onto a device of a fake accelerator (a
// DeviceGuardImplInterface that records the stream, event and wait calls it
// gets), so that a CPU test sees the order the runtime asks for. An empty
// function switches it off. Set while no pipeline exists; returns the
// previous mapping.
using StreamDevices = std::function<std::optional<c10::Device>(int worker)>;
StreamDevices set_stream_devices(StreamDevices devices);
}  // namespace testing

}  // namespace conveyor
