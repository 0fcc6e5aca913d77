#pragma once
// Times several functions side by side: their runs alternate (fns[0],
// fns[1], ..., then again), so a slow spell of the machine hits all alike.
// On CUDA each run is timed with events on the current stream, elsewhere
// with a steady clock. Returns the median milliseconds of each, after
// `warmup` untimed rounds.

#include <ATen/core/Tensor.h>

#ifdef CONVEYOR_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "plugin/support/timing.h"

namespace conveyor::bench {

inline std::vector<double> alternated_median_ms(bool cuda, int warmup, int repeats,
                                                const std::vector<std::function<void()>>& fns) {
  for (int i = 0; i < warmup; ++i) {
    for (const auto& fn : fns) fn();
  }
  std::vector<std::vector<double>> ms(fns.size());
#ifdef CONVEYOR_WITH_CUDA
  if (cuda) {
    cudaEvent_t start, stop;
    C10_CUDA_CHECK(cudaEventCreate(&start));
    C10_CUDA_CHECK(cudaEventCreate(&stop));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < repeats; ++i) {
      for (size_t f = 0; f < fns.size(); ++f) {
        C10_CUDA_CHECK(cudaEventRecord(start, stream));
        fns[f]();
        C10_CUDA_CHECK(cudaEventRecord(stop, stream));
        C10_CUDA_CHECK(cudaEventSynchronize(stop));
        float elapsed = 0;
        C10_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
        ms[f].push_back(elapsed);
      }
    }
    C10_CUDA_CHECK(cudaEventDestroy(start));
    C10_CUDA_CHECK(cudaEventDestroy(stop));
  }
#endif
  if (!cuda) {
    for (int i = 0; i < repeats; ++i) {
      for (size_t f = 0; f < fns.size(); ++f) {
        const auto t0 = std::chrono::steady_clock::now();
        fns[f]();
        ms[f].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  std::vector<double> medians;
  for (auto& m : ms) medians.push_back(median(m));
  return medians;
}

}  // namespace conveyor::bench
