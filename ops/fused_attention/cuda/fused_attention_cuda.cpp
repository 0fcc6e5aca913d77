// The CUDA binding: checks arguments (the same checks and messages as the CPU
// reference), makes the tensors contiguous, allocates outputs and workspaces,
// and hands plain parameter blocks to the launchers: the tensor-core kernels
// for float16 / bfloat16 at head_dim 64 and 128 with 16-byte aligned tensors
// (cuda::flash_takes), the general kernels otherwise.

#include "ops/fused_attention/cuda/attention_kernels.h"
#include "ops/fused_attention/fused_attention.h"
#include "ops/fused_attention/fused_attention_checks.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

namespace conveyor {
namespace {

namespace cuda = attention::cuda;
using attention::AttentionShape;

cuda::ElementType element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return cuda::ElementType::kHalf;
    case at::kBFloat16:
      return cuda::ElementType::kBFloat16;
    case at::kFloat:
      return cuda::ElementType::kFloat;
    default:
      return cuda::ElementType::kDouble;  // check_forward_inputs admits nothing else
  }
}

// Grid limits: blocks over the sequence in x, heads in y, batch in z.
void check_launchable(const at::Tensor& q, const AttentionShape& s) {
  TORCH_CHECK(q.is_cuda(), "fused_attention: expected CUDA tensors, got q on ", q.device());
  TORCH_CHECK(s.batch <= 65535, "fused_attention: batch (dim 0) is ", s.batch, "; the CUDA kernels take at most 65535");
  TORCH_CHECK(s.heads <= 65535, "fused_attention: heads (dim 1) is ", s.heads, "; the CUDA kernels take at most 65535");
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK(s.q_len <= kIntMax && s.k_len <= kIntMax && s.head_dim <= kIntMax,
              "fused_attention: sequence lengths and head_dim must fit in 32 bits, got q_len ", s.q_len, ", k_len ",
              s.k_len, ", head_dim ", s.head_dim);
}

cuda::ForwardParams forward_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& mask, const AttentionShape& s, bool causal, double scale) {
  cuda::ForwardParams p;
  p.q = q.const_data_ptr();
  p.k = k.const_data_ptr();
  p.v = v.const_data_ptr();
  p.key_padding_mask = mask.defined() ? reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>()) : nullptr;
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.q_len = static_cast<int>(s.q_len);
  p.k_len = static_cast<int>(s.k_len);
  p.head_dim = static_cast<int>(s.head_dim);
  p.scale = scale;
  p.causal = causal;
  p.dtype = element_type(q.scalar_type());
  return p;
}

at::Tensor contiguous_mask(const std::optional<at::Tensor>& mask) {
  return mask.has_value() && mask->defined() ? mask->contiguous() : at::Tensor();
}

// The tensor-core kernel the dispatch table (or an override) names for this
// call. tiles128 takes the row max of raw scores, which needs scale > 0: a
// scale of 0 or below runs v1, which scales first.
cuda::FlashKernel flash_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, bool causal,
                               bool train, double scale) {
  if (scale <= 0) return cuda::FlashKernel::kV1;
  const std::string name = fused_kernel(attention_query(q, k, mask.defined(), causal, train));
  return name == "v1" ? cuda::FlashKernel::kV1 : cuda::FlashKernel::kTiles128;
}

// `train`: called for autograd (fused_attention_forward), whose backward follows.
std::tuple<at::Tensor, at::Tensor> forward_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                                const std::optional<at::Tensor>& key_padding_mask, bool causal,
                                                std::optional<double> scale, bool train) {
  const AttentionShape s = attention::check_forward_inputs(q_in, k_in, v_in, key_padding_mask);
  check_launchable(q_in, s);
  const double softmax_scale = attention::resolve_scale(scale, s.head_dim);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor mask = contiguous_mask(key_padding_mask);
  at::Tensor out = at::empty_like(q);
  const at::ScalarType lse_dtype = attention::accumulate_dtype(q.scalar_type());
  at::Tensor lse = at::empty({s.batch, s.heads, s.q_len}, q.options().dtype(lse_dtype));
  if (out.numel() == 0) return {out, lse};
  if (s.k_len == 0) return {out.zero_(), lse.zero_()};  // every row fully masked

  cuda::ForwardParams p = forward_params(q, k, v, mask, s, causal, softmax_scale);
  p.out = out.data_ptr();
  p.lse = lse.data_ptr();
  p.flash_kernel = flash_kernel(q, k, mask, causal, train, softmax_scale);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (cuda::flash_takes(p)) {
    cuda::launch_flash_forward(p, stream);
  } else {
    cuda::launch_simple_forward(p, stream);
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, const std::optional<at::Tensor>& key_padding_mask, bool causal,
    std::optional<double> scale) {
  const AttentionShape s =
      attention::check_backward_inputs(grad_out_in, q_in, k_in, v_in, out_in, lse_in, key_padding_mask);
  check_launchable(q_in, s);
  const double softmax_scale = attention::resolve_scale(scale, s.head_dim);
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor out = out_in.contiguous(), grad_out = grad_out_in.contiguous(), lse = lse_in.contiguous();
  const at::Tensor mask = contiguous_mask(key_padding_mask);
  if (q.numel() == 0 || k.numel() == 0) return {at::zeros_like(q), at::zeros_like(k), at::zeros_like(v)};

  cuda::BackwardParams bp;
  bp.fwd = forward_params(q, k, v, mask, s, causal, softmax_scale);
  bp.fwd.flash_kernel = flash_kernel(q, k, mask, causal, /*train=*/true, softmax_scale);
  bp.fwd.out = const_cast<void*>(out.const_data_ptr());
  bp.fwd.lse = const_cast<void*>(lse.const_data_ptr());
  bp.grad_out = grad_out.const_data_ptr();
  const at::Tensor row_dot = at::empty_like(lse);
  at::Tensor grad_k = at::empty_like(k), grad_v = at::empty_like(v);
  bp.row_dot = row_dot.data_ptr();
  bp.grad_k = grad_k.data_ptr();
  bp.grad_v = grad_v.data_ptr();
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (cuda::flash_takes(bp)) {
    at::Tensor grad_q_accum = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    bp.grad_q_accum = grad_q_accum.data_ptr<float>();
    cuda::launch_flash_backward(bp, stream);
    return {grad_q_accum.to(q.scalar_type()), grad_k, grad_v};  // the kernel scales dQ as it adds it
  }
  at::Tensor grad_q = at::empty_like(q);
  bp.grad_q = grad_q.data_ptr();
  cuda::launch_simple_backward(bp, stream);
  return {grad_q, grad_k, grad_v};
}

std::tuple<at::Tensor, at::Tensor> attention_forward_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                          const std::optional<at::Tensor>& key_padding_mask,
                                                          bool causal, std::optional<double> scale) {
  return forward_cuda(q, k, v, key_padding_mask, causal, scale, /*train=*/true);
}

at::Tensor attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& key_padding_mask, bool causal, std::optional<double> scale) {
  return std::get<0>(forward_cuda(q, k, v, key_padding_mask, causal, scale, /*train=*/false));
}

}  // namespace

TORCH_LIBRARY_IMPL(conveyor, CUDA, m) {
  m.impl("fused_attention", &attention_cuda);
  m.impl("fused_attention_forward", &attention_forward_cuda);
  m.impl("fused_attention_backward", &attention_backward_cuda);
}

}  // namespace conveyor
