#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>

#include <map>
#include <mutex>
#include <utility>

namespace conveyor::cuda {

void allow_shared_memory(const void* kernel, size_t bytes) {
  constexpr size_t kDefault = 48 * 1024;  // what every kernel may use without opting in
  if (bytes <= kDefault) return;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& now = allowed[{device, kernel}];
  if (now >= bytes) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  now = bytes;
}

}  // namespace conveyor::cuda
