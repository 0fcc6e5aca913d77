// CUDA count_nonfinite: one grid-stride pass per tensor, a block-level
// reduction in shared memory, one atomic per block into an int64 counter.

#include "ops/nonfinite/nonfinite.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace conveyor {
namespace {

constexpr int kThreads = 256;

// Half and bfloat16 widen to float exactly; double keeps its own range (a
// finite double can overflow float).
template <typename T>
__device__ bool is_nonfinite(T v) {
  return !isfinite(static_cast<float>(v));
}
__device__ bool is_nonfinite(double v) { return !isfinite(v); }

template <typename T>
__global__ void count_nonfinite_kernel(const T* __restrict__ data, int64_t n, unsigned long long* __restrict__ count) {
  __shared__ unsigned int partial[kThreads];
  unsigned int mine = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    mine += is_nonfinite(data[i]) ? 1u : 0u;
  }
  partial[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0 && partial[0] > 0) atomicAdd(count, static_cast<unsigned long long>(partial[0]));
}

at::Tensor count_nonfinite_cuda(at::TensorList tensors) {
  const c10::Device device = tensors.front().device();
  const c10::cuda::CUDAGuard guard(device);
  at::Tensor count = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(device));
  auto* counter = reinterpret_cast<unsigned long long*>(count.data_ptr<int64_t>());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int max_blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 4;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device() == device, "conveyor::count_nonfinite: all tensors must be on one device, got ", t.device(),
                " and ", device);
    if (!t.is_floating_point() || t.numel() == 0) continue;
    const at::Tensor c = t.contiguous();
    const int64_t n = c.numel();
    const int blocks = static_cast<int>(std::min<int64_t>(max_blocks, (n + kThreads - 1) / kThreads));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "count_nonfinite_cuda", [&] {
      count_nonfinite_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(c.const_data_ptr<scalar_t>(), n, counter);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return count;
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, CUDA, m) { m.impl("count_nonfinite", &count_nonfinite_cuda); }

}  // namespace conveyor
