// The runtime's bookkeeping around an update, timed per layer
// (plugin/measure/update_timing.h).
#include "plugin/measure/update_timing.h"

#include "ops/nonfinite/nonfinite.h"
#include "plugin/measure/device_timing.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include <unistd.h>

namespace conveyor::measure_detail {

namespace {

// A CPU core's cache: written over before each timing of a layer's
// bookkeeping, which in a step runs after other work, not on the weights it
// just touched (a copy of 1 MiB runs at several times the speed from the core's
// own cache as from the shared one).
class CacheEvictor {
 public:
  explicit CacheEvictor(const c10::Device& device) {
    if (!device.is_cpu()) return;
    int64_t bytes = 4 << 20;
#ifdef _SC_LEVEL2_CACHE_SIZE
    bytes = std::max<int64_t>(bytes, 2 * sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
    scratch_ = at::empty({std::min<int64_t>(bytes, 64 << 20)}, at::kByte);
  }
  void operator()() {
    if (scratch_.defined()) scratch_.fill_(++round_);
  }

 private:
  at::Tensor scratch_;
  uint8_t round_ = 0;
};

}  // namespace

// Each the median of the repeats after the warm-up.
void time_updates(const torch::nn::AnyModule& layer, const ProfileOptions& o, const c10::Device& device,
                  LayerProfile& out) {
  std::vector<at::Tensor> copies, grads;
  for (const auto& p : layer.ptr()->parameters()) {
    if (!p.requires_grad()) continue;
    at::Tensor c = p.detach().clone().set_requires_grad(true);
    c.mutable_grad() = at::ones_like(c);
    grads.push_back(c.grad());
    copies.push_back(c);
  }
  if (copies.empty()) return;
  CacheEvictor evict(device);
  const auto time = [&](const std::function<void()>& work) {
    std::vector<double> runs;
    for (int r = 0; r < o.warmup() + o.repeats(); ++r) {
      evict();
      const double t = seconds_of(device, work);
      if (r >= o.warmup()) runs.push_back(t);
    }
    return median(runs);
  };
  out.check_seconds = time([&] { (void)count_nonfinite(grads).item<int64_t>(); });
  out.copy_seconds = time([&] {
    for (const auto& c : copies) (void)c.detach().clone();
  });
  if (!o.optimizer()) return;
  auto optimizer = o.optimizer()(copies);
  out.update_seconds = time([&] { optimizer->step(); });
}

}  // namespace conveyor::measure_detail
