// Instantiates the general CUDA kernels for every dtype and launches them,
// after checking that head_dim's tiles fit in the device's shared memory.

#include "ops/fused_attention/cuda/simple_attention_kernels.cuh"

#include "ops/cuda/shared_memory.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

namespace conveyor::attention::cuda {
namespace {

const char* dtype_name(ElementType dtype) {
  switch (dtype) {
    case ElementType::kHalf:
      return "Half";
    case ElementType::kBFloat16:
      return "BFloat16";
    case ElementType::kFloat:
      return "Float";
    case ElementType::kDouble:
      return "Double";
  }
  return "?";
}

// Raises naming head_dim when `elements` of Acc do not fit in one block's
// shared memory; opts the kernel in above the default 48 KB.
template <typename Kernel>
int prepare_shared_memory(Kernel kernel, int64_t elements, size_t acc_size, const ForwardParams& p) {
  const int64_t bytes = elements * static_cast<int64_t>(acc_size);
  int device = 0, limit = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TORCH_CHECK(bytes <= limit, "fused_attention: head_dim ", p.head_dim, " with dtype ", dtype_name(p.dtype), " needs ",
              bytes, " bytes of shared memory per block on CUDA, more than this device's ", limit,
              "; use a smaller head_dim");
  conveyor::cuda::allow_shared_memory(kernel, static_cast<size_t>(bytes));
  return static_cast<int>(bytes);
}

template <typename T, typename Acc>
void run_forward(const ForwardParams& p, cudaStream_t stream) {
  const auto kernel = simple_forward_kernel<T, Acc>;
  const int smem = prepare_shared_memory(kernel, SimpleTiles::forward_elements(p.head_dim), sizeof(Acc), p);
  const dim3 grid((p.q_len + SimpleTiles::kBlockM - 1) / SimpleTiles::kBlockM, p.heads, p.batch);
  kernel<<<grid, SimpleTiles::kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Acc>
void run_row_dot(const BackwardParams& bp, cudaStream_t stream) {
  const ForwardParams& p = bp.fwd;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.q_len;
  const int64_t blocks = (rows + SimpleTiles::kWarps - 1) / SimpleTiles::kWarps;
  TORCH_CHECK(blocks <= 0x7fffffff, "fused_attention: batch * heads * q_len = ", rows, " rows is too many");
  if (blocks == 0) return;
  row_dot_kernel<T, Acc><<<static_cast<unsigned>(blocks), SimpleTiles::kThreads, 0, stream>>>(bp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, typename Acc>
void run_backward(const BackwardParams& bp, cudaStream_t stream) {
  const ForwardParams& p = bp.fwd;
  run_row_dot<T, Acc>(bp, stream);
  const auto dkdv = simple_dkdv_kernel<T, Acc>;
  const int dkdv_smem = prepare_shared_memory(dkdv, SimpleTiles::dkdv_elements(p.head_dim), sizeof(Acc), p);
  const dim3 key_grid((p.k_len + SimpleTiles::kBlockN - 1) / SimpleTiles::kBlockN, p.heads, p.batch);
  dkdv<<<key_grid, SimpleTiles::kThreads, dkdv_smem, stream>>>(bp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto dq = simple_dq_kernel<T, Acc>;
  const int dq_smem = prepare_shared_memory(dq, SimpleTiles::dq_elements(p.head_dim), sizeof(Acc), p);
  const dim3 query_grid((p.q_len + SimpleTiles::kBlockM - 1) / SimpleTiles::kBlockM, p.heads, p.batch);
  dq<<<query_grid, SimpleTiles::kThreads, dq_smem, stream>>>(bp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Calls f.template operator()<T, Acc>() for the dtype.
template <typename F>
void dispatch(ElementType dtype, F&& f) {
  switch (dtype) {
    case ElementType::kHalf:
      return f.template operator()<__half, float>();
    case ElementType::kBFloat16:
      return f.template operator()<__nv_bfloat16, float>();
    case ElementType::kFloat:
      return f.template operator()<float, float>();
    case ElementType::kDouble:
      return f.template operator()<double, double>();
  }
}

}  // namespace

void launch_simple_forward(const ForwardParams& params, cudaStream_t stream) {
  dispatch(params.dtype, [&]<typename T, typename Acc>() { run_forward<T, Acc>(params, stream); });
}

void launch_simple_backward(const BackwardParams& params, cudaStream_t stream) {
  dispatch(params.fwd.dtype, [&]<typename T, typename Acc>() { run_backward<T, Acc>(params, stream); });
}

void launch_row_dot(const BackwardParams& params, cudaStream_t stream) {
  dispatch(params.fwd.dtype, [&]<typename T, typename Acc>() { run_row_dot<T, Acc>(params, stream); });
}

}  // namespace conveyor::attention::cuda
