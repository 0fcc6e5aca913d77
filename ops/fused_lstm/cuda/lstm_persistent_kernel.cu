// The persistent kernels' launchers (the kernels: lstm_persistent_kernel.cuh,
// and the first forward kernel, lstm_persistent_warp_kernel.cuh).
#include "ops/fused_lstm/cuda/lstm_persistent_kernel.cuh"
#include "ops/fused_lstm/cuda/lstm_persistent_warp_kernel.cuh"

#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

namespace conveyor::lstm::cuda {
namespace {

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// The current device's multiprocessors and per-block shared memory (opt-in
// maximum), or sms = 0 where it cannot run a cooperative launch.
struct Device {
  int index = 0;
  int sms = 0;
  size_t shared_limit = 0;
};

// What a launch asks of CUDA, asked once (a layer's call launches one kernel,
// and at micro-batch sizes the host's time per call counts): the device's
// attributes, and how many blocks of a kernel fit on a multiprocessor.
std::mutex cache_mutex;

Device current_device() {
  static std::map<int, Device> devices;
  int index = 0;
  C10_CUDA_CHECK(cudaGetDevice(&index));
  std::lock_guard<std::mutex> lock(cache_mutex);
  const auto it = devices.find(index);
  if (it != devices.end()) return it->second;
  Device d{index, 0, 0};
  if (device_attribute(cudaDevAttrCooperativeLaunch, index) != 0) {
    d.sms = device_attribute(cudaDevAttrMultiProcessorCount, index);
    d.shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
  }
  return devices.emplace(index, d).first->second;
}

int blocks_per_sm(const void* kernel, int threads, size_t shared_bytes, int device) {
  static std::map<std::tuple<const void*, int, size_t, int>, int> known;
  const auto key = std::make_tuple(kernel, threads, shared_bytes, device);
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes));
  std::lock_guard<std::mutex> lock(cache_mutex);
  known[key] = blocks;
  return blocks;
}

// Launches `kernel` on `blocks` blocks of `threads` at once, or returns false
// (launching nothing) when they cannot all be resident.
template <typename Kernel, typename... Args>
bool launch_cooperative(Kernel* kernel, const Device& d, int blocks, int threads, size_t shared_bytes,
                        cudaStream_t stream, Args... args) {
  conveyor::cuda::allow_shared_memory(kernel, shared_bytes);
  const void* entry = reinterpret_cast<const void*>(kernel);
  if (static_cast<int64_t>(blocks_per_sm(entry, threads, shared_bytes, d.index)) * d.sms < blocks) return false;
  void* pointers[] = {static_cast<void*>(&args)...};
  const cudaError_t status = cudaLaunchCooperativeKernel(entry, dim3(blocks), dim3(threads), pointers, shared_bytes,
                                                         stream);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // clear it; the caller falls back to the per-step kernel
    return false;
  }
  C10_CUDA_CHECK(status);
  return true;
}

template <typename scalar_t>
constexpr bool math_applies(Math math) {
  if (math == Math::kMma16) return std::is_same_v<scalar_t, c10::Half> || std::is_same_v<scalar_t, c10::BFloat16>;
  if (math == Math::kTf32) return std::is_same_v<scalar_t, float>;
  return true;
}

// The forward (a ForwardSequence) or backward (a BackwardSequence) persistent
// kernel with product `math`, laid out for the device.
template <typename scalar_t, Math math, typename Sequence>
bool launch_persistent(const Sequence& seq, const Device& d, cudaStream_t stream) {
  constexpr bool kBackward = std::is_same_v<Sequence, BackwardSequence<scalar_t>>;
  const persistent::Plan p = persistent::plan<scalar_t, math>(seq.hidden, seq.batch, d.sms, d.shared_limit, kBackward);
  if (p.layout.bytes == 0) return false;
  const auto kernel = [] {
    if constexpr (kBackward) {
      return &persistent::lstm_backward_persistent_kernel<scalar_t, math>;
    } else {
      return &persistent::lstm_forward_persistent_kernel<scalar_t, math>;
    }
  }();
  return launch_cooperative(kernel, d, p.blocks, persistent::kThreads, p.layout.bytes, stream, seq,
                            p.units_per_block, p.layout);
}

// launch_persistent for the runtime `math`, instantiating only the
// combinations that exist.
template <typename scalar_t, typename Sequence>
bool with_math(Math math, const Sequence& seq, cudaStream_t stream) {
  TORCH_CHECK(math_applies<scalar_t>(math), "fused_lstm: this arithmetic does not apply to the dtype");
  const Device d = current_device();
  if (d.sms == 0) return false;
  switch (math) {
    case Math::kMma16:
      if constexpr (math_applies<scalar_t>(Math::kMma16)) return launch_persistent<scalar_t, Math::kMma16>(seq, d, stream);
      break;
    case Math::kTf32:
      if constexpr (math_applies<scalar_t>(Math::kTf32)) return launch_persistent<scalar_t, Math::kTf32>(seq, d, stream);
      break;
    case Math::kFma:
      return launch_persistent<scalar_t, Math::kFma>(seq, d, stream);
  }
  return false;
}

}  // namespace

template <typename scalar_t>
bool try_launch_forward_persistent(const ForwardSequence<scalar_t>& seq, Math math, cudaStream_t stream) {
  return with_math<scalar_t>(math, seq, stream);
}

template <typename scalar_t>
bool try_launch_backward_persistent(const BackwardSequence<scalar_t>& seq, Math math, cudaStream_t stream) {
  return with_math<scalar_t>(math, seq, stream);
}

template <typename scalar_t>
bool try_launch_forward_persistent_warp(const ForwardSequence<scalar_t>& seq, cudaStream_t stream) {
  if (seq.batch > persistent_warp::kMaxBatch) return false;
  const Device d = current_device();
  if (d.sms == 0) return false;
  const persistent_warp::Plan p = persistent_warp::plan<scalar_t>(seq.hidden, seq.batch, d.sms);
  if (p.shared_bytes > d.shared_limit) return false;
  return launch_cooperative(&persistent_warp::lstm_forward_persistent_kernel<scalar_t>, d, p.blocks,
                            persistent_warp::kThreads, p.shared_bytes, stream, seq, p.units_per_block);
}

#define CONVEYOR_INSTANTIATE_LSTM_PERSISTENT(T)                                                                \
  template bool try_launch_forward_persistent<T>(const ForwardSequence<T>&, Math, cudaStream_t);               \
  template bool try_launch_backward_persistent<T>(const BackwardSequence<T>&, Math, cudaStream_t);             \
  template bool try_launch_forward_persistent_warp<T>(const ForwardSequence<T>&, cudaStream_t);
CONVEYOR_INSTANTIATE_LSTM_PERSISTENT(float)
CONVEYOR_INSTANTIATE_LSTM_PERSISTENT(double)
CONVEYOR_INSTANTIATE_LSTM_PERSISTENT(c10::Half)
CONVEYOR_INSTANTIATE_LSTM_PERSISTENT(c10::BFloat16)
#undef CONVEYOR_INSTANTIATE_LSTM_PERSISTENT

}  // namespace conveyor::lstm::cuda
