// Instantiates the tensor-core backwards (tiles128: query blocks
// double-buffered, at head_dim 128 two warps to a key row block; v1: one
// buffer, one warp to a row block) for float16 / bfloat16 x head_dim 64 /
// 128: rowsum(dO * O) first, then the key-block kernel, which accumulates dQ
// (scaled, float) into params.grad_q_accum for the caller to convert.

#include "ops/fused_attention/cuda/flash_backward_kernel.cuh"

#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

namespace conveyor::attention::cuda {
namespace {

template <typename Config, typename T>
void run(const BackwardParams& params, cudaStream_t stream) {
  const auto kernel = flash_backward_kernel<T, Config>;
  conveyor::cuda::allow_shared_memory(kernel, Config::kSmemBytes);
  const ForwardParams& p = params.fwd;
  const dim3 grid((p.k_len + Config::kBlockN - 1) / Config::kBlockN, p.heads, p.batch);
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kHeadDim>
void run_flash_backward(const BackwardParams& params, cudaStream_t stream) {
  if (params.fwd.flash_kernel == FlashKernel::kV1) {
    run<FlashBackwardConfigFor<T, kHeadDim>, T>(params, stream);
  } else {
    run<TilesBackwardConfigFor<T, kHeadDim>, T>(params, stream);
  }
}

template <typename T>
void run_for_head_dim(const BackwardParams& params, cudaStream_t stream) {
  if (params.fwd.head_dim == 64) {
    run_flash_backward<T, 64>(params, stream);
  } else {
    run_flash_backward<T, 128>(params, stream);
  }
}

}  // namespace

void launch_flash_backward(const BackwardParams& params, cudaStream_t stream) {
  TORCH_CHECK(flash_takes(params),
              "fused_attention: the tensor-core kernel takes 16-byte aligned float16 or bfloat16 tensors with "
              "head_dim 64 or 128, got head_dim ",
              params.fwd.head_dim);
  TORCH_CHECK(params.grad_q_accum != nullptr, "fused_attention: the tensor-core backward needs grad_q_accum");
  launch_row_dot(params, stream);
  if (params.fwd.dtype == ElementType::kHalf) {
    run_for_head_dim<__half>(params, stream);
  } else {
    run_for_head_dim<__nv_bfloat16>(params, stream);
  }
}

}  // namespace conveyor::attention::cuda
