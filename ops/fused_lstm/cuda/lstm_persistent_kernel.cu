// The persistent forward kernel's launcher (the kernel: lstm_persistent_kernel.cuh).
#include "ops/fused_lstm/cuda/lstm_persistent_kernel.cuh"

#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>

namespace conveyor::lstm::cuda {
namespace {

using persistent::kMaxBatch;
using persistent::kThreads;

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

}  // namespace

template <typename scalar_t>
bool try_launch_forward_persistent(const ForwardSequence<scalar_t>& seq, cudaStream_t stream) {
  if (seq.batch > kMaxBatch) return false;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  if (device_attribute(cudaDevAttrCooperativeLaunch, device) == 0) return false;
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  const size_t shared_limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device));

  const persistent::Plan plan = persistent::plan<scalar_t>(seq.hidden, seq.batch, sms);
  const int units_per_block = plan.units_per_block, blocks = plan.blocks;
  const size_t shared_bytes = plan.shared_bytes;
  if (shared_bytes > shared_limit) return false;

  auto* kernel = &persistent::lstm_forward_persistent_kernel<scalar_t>;
  conveyor::cuda::allow_shared_memory(kernel, shared_bytes);
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, shared_bytes));
  if (static_cast<int64_t>(blocks_per_sm) * sms < blocks) return false;

  ForwardSequence<scalar_t> args_seq = seq;
  int args_units = units_per_block;
  void* args[] = {&args_seq, &args_units};
  const cudaError_t status = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks),
                                                         dim3(kThreads), args, shared_bytes, stream);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // clear it; the caller falls back to the per-step kernel
    return false;
  }
  C10_CUDA_CHECK(status);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template bool try_launch_forward_persistent<float>(const ForwardSequence<float>&, cudaStream_t);
template bool try_launch_forward_persistent<double>(const ForwardSequence<double>&, cudaStream_t);
template bool try_launch_forward_persistent<c10::Half>(const ForwardSequence<c10::Half>&, cudaStream_t);
template bool try_launch_forward_persistent<c10::BFloat16>(const ForwardSequence<c10::BFloat16>&, cudaStream_t);

}  // namespace conveyor::lstm::cuda
