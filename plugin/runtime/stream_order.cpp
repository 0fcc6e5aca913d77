#include "plugin/runtime/stream_order.h"

#include "plugin/support/streams.h"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <utility>

namespace conveyor {
namespace {

std::mutex& devices_mutex() {
  static std::mutex mutex;
  return mutex;
}

testing::StreamDevices& test_devices() {
  static testing::StreamDevices devices;
  return devices;
}

}  // namespace

std::optional<c10::Device> stream_device(const c10::Device& stage_device, int worker) {
  {
    std::lock_guard<std::mutex> lock(devices_mutex());
    if (test_devices()) return test_devices()(worker);
  }
  if (stage_device.is_cpu()) return std::nullopt;
  return stage_device;
}

void workers_wait_for_caller(const std::vector<std::optional<c10::Stream>>& worker_streams) {
  std::vector<std::pair<c10::Device, c10::Event>> recorded;  // one event a device
  for (const std::optional<c10::Stream>& maybe : worker_streams) {
    if (!maybe) continue;
    const c10::Stream& stream = *maybe;
    auto it = std::find_if(recorded.begin(), recorded.end(),
                           [&](const auto& entry) { return entry.first == stream.device(); });
    if (it == recorded.end()) {
      c10::Event caller_done(stream.device_type());
      caller_done.record(current_stream(stream.device()));
      recorded.emplace_back(stream.device(), std::move(caller_done));
      it = std::prev(recorded.end());
    }
    it->second.block(stream);
  }
}

c10::Event worker_finished(const c10::Stream& stream) {
  c10::Event done(stream.device_type());
  done.record(stream);
  return done;
}

void caller_waits_for(const std::vector<std::optional<c10::Event>>& finished) {
  for (const std::optional<c10::Event>& done : finished) {
    if (done) done->block(current_stream(done->device()));
  }
}

namespace testing {
StreamDevices set_stream_devices(StreamDevices devices) {
  std::lock_guard<std::mutex> lock(devices_mutex());
  std::swap(test_devices(), devices);
  return devices;
}
}  // namespace testing

}  // namespace conveyor
