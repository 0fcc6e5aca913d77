// Instantiates the tensor-core forwards (tiles128 and v1) for float16 /
// bfloat16 x head_dim 64 / 128 and runs the one the call names.

#include "ops/fused_attention/cuda/flash_forward_kernel.cuh"
#include "ops/fused_attention/cuda/flash_forward_tiles_kernel.cuh"

#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

namespace conveyor::attention::cuda {
namespace {

template <typename Config, typename Kernel>
void run(Kernel kernel, const ForwardParams& params, cudaStream_t stream) {
  // The tiles, and a flag a key block for the mask (forward_smem_bytes).
  const size_t smem = forward_smem_bytes<Config>(params.k_len);
  conveyor::cuda::allow_shared_memory(kernel, smem);
  const dim3 grid((params.q_len + Config::kBlockM - 1) / Config::kBlockM, params.heads, params.batch);
  kernel<<<grid, Config::kThreads, smem, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kHeadDim>
void run_flash_forward(const ForwardParams& params, cudaStream_t stream) {
  if (params.flash_kernel == FlashKernel::kV1) {
    using Config = FlashForwardConfigFor<T, kHeadDim>;
    run<Config>(flash_forward_kernel<T, Config>, params, stream);
  } else {
    using Config = TilesForwardConfigFor<T, kHeadDim>;
    run<Config>(flash_forward_tiles_kernel<T, Config>, params, stream);
  }
}

template <typename T>
void run_for_head_dim(const ForwardParams& params, cudaStream_t stream) {
  if (params.head_dim == 64) {
    run_flash_forward<T, 64>(params, stream);
  } else {
    run_flash_forward<T, 128>(params, stream);
  }
}

}  // namespace

void launch_flash_forward(const ForwardParams& params, cudaStream_t stream) {
  TORCH_CHECK(flash_takes(params),
              "fused_attention: the tensor-core kernel takes 16-byte aligned float16 or bfloat16 tensors with "
              "head_dim 64 or 128, got head_dim ",
              params.head_dim);
  if (params.dtype == ElementType::kHalf) {
    run_for_head_dim<__half>(params, stream);
  } else {
    run_for_head_dim<__nv_bfloat16>(params, stream);
  }
}

}  // namespace conveyor::attention::cuda
