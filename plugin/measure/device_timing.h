#pragma once
// Timing work on a device: a CUDA device is synchronised before and after,
// so the time is the work's, not its launch's. Shared by the profiler's files.

#include "plugin/support/timing.h"

#include <c10/core/Device.h>
#include <torch/cuda.h>

#include <chrono>
#include <utility>

namespace conveyor::measure_detail {

inline void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Seconds `fn` takes on `device`.
template <typename Fn>
double seconds_of(const c10::Device& device, Fn&& fn) {
  synchronize(device);
  const auto start = Clock::now();
  std::forward<Fn>(fn)();
  synchronize(device);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace conveyor::measure_detail
