// The link between stages in one process: a handoff between threads on one
// device, a copy between two (LinkProfile, plugin/planner/profile.h).
#include "plugin/measure/device_timing.h"
#include "plugin/measure/profile_model.h"

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace conveyor {

using measure_detail::seconds_of;
using measure_detail::synchronize;

LinkProfile measure_link(const c10::Device& from, const c10::Device& to) {
  LinkProfile link;
  if (from == to) {
    // The in-process transport hands the tensors over without a copy: what
    // costs is waking the receiving thread. Measured as half a round trip.
    link.kind = "in-process handoff (same device, no copy)";
    std::mutex mutex;
    std::condition_variable cv;
    int turn = 0;
    constexpr int kRounds = 200;
    std::thread peer([&] {
      for (int r = 0; r < kRounds; ++r) {
        std::unique_lock lock(mutex);
        cv.wait(lock, [&] { return turn % 2 == 1; });
        ++turn;
        cv.notify_all();
      }
    });
    const auto start = Clock::now();
    for (int r = 0; r < kRounds; ++r) {
      std::unique_lock lock(mutex);
      ++turn;
      cv.notify_all();
      cv.wait(lock, [&] { return turn % 2 == 0; });
    }
    const double total = std::chrono::duration<double>(Clock::now() - start).count();
    peer.join();
    link.latency_seconds = total / (2.0 * kRounds);
    return link;
  }
  link.kind = from.str() + " -> " + to.str() + " copy";
  // (a copy's latency is the small copy's time; its bandwidth the large one's rate)
  const auto copy_seconds = [&](int64_t bytes) {
    const at::Tensor t = at::ones({bytes / 4}, at::TensorOptions().device(from).dtype(at::kFloat));
    std::vector<double> runs;
    for (int r = 0; r < 7; ++r) {
      runs.push_back(seconds_of(to, [&] {
        synchronize(from);
        const at::Tensor moved = t.to(to);
        (void)moved;
      }));
    }
    return median(runs);
  };
  constexpr int64_t kSmall = 4 << 10, kLarge = 64 << 20;
  const double small = copy_seconds(kSmall), large = copy_seconds(kLarge);
  link.latency_seconds = small;
  link.bytes_per_second = large > small ? static_cast<double>(kLarge - kSmall) / (large - small) : 0.0;
  return link;
}

}  // namespace conveyor
