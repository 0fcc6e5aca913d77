#include "ops/fused_attention/fused_attention_checks.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace conveyor::attention {
namespace {

constexpr const char* kDims[] = {"batch", "heads", "seq_len", "head_dim"};

void check_rank4(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), "fused_attention: ", name, " is undefined");
  TORCH_CHECK(t.dim() == 4, "fused_attention: ", name,
              " must be a 4-D tensor [batch, heads, seq_len, head_dim], got a ", t.dim(), "-D tensor of shape ",
              t.sizes());
}

void check_same_dim(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name, int dim) {
  TORCH_CHECK(t.size(dim) == ref.size(dim), "fused_attention: ", name, " has ", kDims[dim], " (dim ", dim, ") ",
              t.size(dim), " but ", ref_name, " has ", ref.size(dim), " (", name, " ", t.sizes(), ", ", ref_name, " ",
              ref.sizes(), ")");
}

void check_like_q(const at::Tensor& t, const char* name, const at::Tensor& q) {
  check_rank4(t, name);
  TORCH_CHECK(t.sizes() == q.sizes(), "fused_attention: ", name, " must have q's shape ", q.sizes(), ", got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), "fused_attention: ", name, " has dtype ", t.scalar_type(),
              " but q has dtype ", q.scalar_type());
  TORCH_CHECK(t.device() == q.device(), "fused_attention: ", name, " is on ", t.device(), " but q is on ", q.device());
}

}  // namespace

AttentionShape check_forward_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& key_padding_mask) {
  check_rank4(q, "q");
  check_rank4(k, "k");
  check_rank4(v, "v");
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "fused_attention: q has dtype ", dtype, "; supported are Float, Double, Half and BFloat16");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    TORCH_CHECK(t->scalar_type() == dtype, "fused_attention: ", name, " has dtype ", t->scalar_type(),
                " but q has dtype ", dtype, "; q, k and v must share one dtype");
    TORCH_CHECK(t->device() == q.device(), "fused_attention: ", name, " is on ", t->device(), " but q is on ",
                q.device());
  }
  check_same_dim(k, "k", q, "q", 0);
  check_same_dim(k, "k", q, "q", 1);
  check_same_dim(k, "k", q, "q", 3);
  check_same_dim(v, "v", k, "k", 0);
  check_same_dim(v, "v", k, "k", 1);
  check_same_dim(v, "v", k, "k", 2);
  check_same_dim(v, "v", q, "q", 3);
  TORCH_CHECK(q.size(3) > 0, "fused_attention: head_dim (dim 3 of q) must be positive, got shape ", q.sizes());

  const AttentionShape shape{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    const at::Tensor& mask = *key_padding_mask;
    TORCH_CHECK(mask.scalar_type() == at::kBool,
                "fused_attention: key_padding_mask must be a bool tensor "
                "(true = ignore that key), got dtype ",
                mask.scalar_type());
    TORCH_CHECK(mask.dim() == 2 && mask.size(0) == shape.batch && mask.size(1) == shape.k_len,
                "fused_attention: key_padding_mask must have shape [batch=", shape.batch, ", k_len=", shape.k_len,
                "], got ", mask.sizes());
    TORCH_CHECK(mask.device() == q.device(), "fused_attention: key_padding_mask is on ", mask.device(), " but q is on ",
                q.device());
  }
  return shape;
}

AttentionShape check_backward_inputs(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                     const std::optional<at::Tensor>& key_padding_mask) {
  const AttentionShape shape = check_forward_inputs(q, k, v, key_padding_mask);
  check_like_q(grad_out, "grad_out", q);
  check_like_q(out, "out", q);
  TORCH_CHECK(lse.defined() && lse.dim() == 3 && lse.size(0) == shape.batch && lse.size(1) == shape.heads &&
                  lse.size(2) == shape.q_len,
              "fused_attention: lse must have shape [batch=", shape.batch, ", heads=", shape.heads,
              ", q_len=", shape.q_len, "], got ", lse.defined() ? lse.sizes() : at::IntArrayRef{});
  TORCH_CHECK(lse.scalar_type() == accumulate_dtype(q.scalar_type()), "fused_attention: lse must have dtype ",
              accumulate_dtype(q.scalar_type()), " for ", q.scalar_type(), " inputs, got ", lse.scalar_type());
  TORCH_CHECK(lse.device() == q.device(), "fused_attention: lse is on ", lse.device(), " but q is on ", q.device());
  return shape;
}

double resolve_scale(std::optional<double> scale, int64_t head_dim) {
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
  TORCH_CHECK(std::isfinite(s), "fused_attention: scale must be finite, got ", s);
  return s;
}

at::ScalarType accumulate_dtype(at::ScalarType input) { return input == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace conveyor::attention
