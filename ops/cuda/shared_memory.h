#pragma once
// A kernel's dynamic shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize)
// is a process-wide attribute of the kernel on each device. Several workers
// launch the same kernel from their own threads with different sizes; set
// per launch to that launch's size, one thread could lower the limit between
// another's set and launch, which then fails. allow_shared_memory raises it,
// never lowers it, under a lock, and calls CUDA only when a (device, kernel)
// needs more than it was given before. For launchers (.cu files): no ATen.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace conveyor::cuda {

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the
// current device; bytes above the default 48 KiB need this before a launch.
// Raises (c10::Error) when CUDA refuses.
void allow_shared_memory(const void* kernel, size_t bytes);

template <typename Kernel>
void allow_shared_memory(Kernel* kernel, size_t bytes) {
  allow_shared_memory(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace conveyor::cuda
