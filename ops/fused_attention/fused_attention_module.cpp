#include "ops/fused_attention/fused_attention_module.h"

#include "ops/fused_attention/fused_attention.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <limits>

namespace conveyor {
namespace {

namespace F = torch::nn::functional;

// Float additive mask: 0 where allowed, -inf where a bool mask says true.
at::Tensor additive_mask(const at::Tensor& mask, const at::TensorOptions& options) {
  if (!mask.defined() || mask.scalar_type() != at::kBool) return mask;
  return at::zeros(mask.sizes(), options).masked_fill_(mask, -std::numeric_limits<double>::infinity());
}

// True above the diagonal of [q_len, k_len]: the keys a top-left causal mask hides.
at::Tensor above_diagonal(int64_t q_len, int64_t k_len, const at::TensorOptions& options) {
  const at::Tensor queries = at::arange(q_len, options.dtype(at::kLong)).unsqueeze(1);
  return at::arange(k_len, options.dtype(at::kLong)).unsqueeze(0) > queries;
}

// True when attn_mask is exactly the top-left causal mask for [L, S].
bool is_causal_mask(const at::Tensor& attn_mask, int64_t q_len, int64_t k_len) {
  if (attn_mask.dim() != 2 || attn_mask.size(0) != q_len || attn_mask.size(1) != k_len) return false;
  const at::Tensor above = above_diagonal(q_len, k_len, attn_mask.options());
  if (attn_mask.scalar_type() == at::kBool) return at::equal(attn_mask, above);
  if (!attn_mask.is_floating_point()) return false;
  return at::equal(at::isneginf(attn_mask), above) && !attn_mask.masked_fill(above, 0).ne(0).any().item<bool>();
}

at::Tensor bool_key_padding_mask(const at::Tensor& mask) {
  if (!mask.defined() || mask.scalar_type() == at::kBool) return mask;
  TORCH_CHECK(mask.scalar_type() == at::kByte,
              "FusedMultiheadAttention: key_padding_mask must be bool "
              "(true = ignore that key) or uint8, got dtype ",
              mask.scalar_type());
  return mask.ne(0);
}

}  // namespace

FusedMultiheadAttentionImpl::FusedMultiheadAttentionImpl(const torch::nn::MultiheadAttentionOptions& options_,
                                                         bool causal_)
    : options(options_), causal(causal_) {
  reset();
}

void FusedMultiheadAttentionImpl::reset() {
  const int64_t E = options.embed_dim();
  TORCH_CHECK(E > 0 && options.num_heads() > 0, "FusedMultiheadAttention: embed_dim (", E, ") and num_heads (",
              options.num_heads(), ") must be positive");
  _qkv_same_embed_dim = options.kdim() == E && options.vdim() == E;
  head_dim = E / options.num_heads();
  TORCH_CHECK(head_dim * options.num_heads() == E, "FusedMultiheadAttention: embed_dim (", E,
              ") must be divisible by num_heads (", options.num_heads(), ")");
  if (_qkv_same_embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * E, E}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", torch::empty({E, E}));
    k_proj_weight = register_parameter("k_proj_weight", torch::empty({E, options.kdim()}));
    v_proj_weight = register_parameter("v_proj_weight", torch::empty({E, options.vdim()}));
  }
  if (options.bias()) in_proj_bias = register_parameter("in_proj_bias", torch::empty({3 * E}));
  out_proj = register_module("out_proj", torch::nn::Linear(torch::nn::LinearOptions(E, E).bias(options.bias())));
  if (options.add_bias_kv()) {
    bias_k = register_parameter("bias_k", torch::empty({1, 1, E}));
    bias_v = register_parameter("bias_v", torch::empty({1, 1, E}));
  }
  // The initialisation torch::nn::MultiheadAttention uses.
  torch::NoGradGuard no_grad;
  for (at::Tensor* w : {&in_proj_weight, &q_proj_weight, &k_proj_weight, &v_proj_weight}) {
    if (w->defined()) torch::nn::init::xavier_uniform_(*w);
  }
  if (in_proj_bias.defined()) {
    in_proj_bias.zero_();
    out_proj->bias.zero_();
  }
  if (bias_k.defined()) torch::nn::init::xavier_normal_(bias_k);
  if (bias_v.defined()) torch::nn::init::xavier_normal_(bias_v);
}

void FusedMultiheadAttentionImpl::use_parameters_of(const torch::nn::MultiheadAttentionImpl& mha) {
  const auto& o = mha.options;
  TORCH_CHECK(o.embed_dim() == options.embed_dim() && o.num_heads() == options.num_heads() &&
                  o.kdim() == options.kdim() && o.vdim() == options.vdim() && o.bias() == options.bias() &&
                  o.add_bias_kv() == options.add_bias_kv() && o.add_zero_attn() == options.add_zero_attn(),
              "FusedMultiheadAttention::use_parameters_of: the MultiheadAttention's options differ from this "
              "module's (embed_dim ",
              o.embed_dim(), " vs ", options.embed_dim(), ", num_heads ", o.num_heads(), " vs ", options.num_heads(),
              ", kdim ", o.kdim(), " vs ", options.kdim(), ", vdim ", o.vdim(), " vs ", options.vdim(), ")");
  auto adopt = [&](const char* name, at::Tensor& member, const at::Tensor& source) {
    TORCH_CHECK(member.defined() == source.defined(), "FusedMultiheadAttention::use_parameters_of: parameter ", name,
                " is defined in only one of the two modules");
    if (!source.defined()) return;
    TORCH_CHECK(source.sizes() == member.sizes(), "FusedMultiheadAttention::use_parameters_of: parameter ", name,
                " has shape ", source.sizes(), ", expected ", member.sizes());
    parameters_[name] = source;
    member = source;
  };
  adopt("in_proj_weight", in_proj_weight, mha.in_proj_weight);
  adopt("q_proj_weight", q_proj_weight, mha.q_proj_weight);
  adopt("k_proj_weight", k_proj_weight, mha.k_proj_weight);
  adopt("v_proj_weight", v_proj_weight, mha.v_proj_weight);
  adopt("in_proj_bias", in_proj_bias, mha.in_proj_bias);
  adopt("bias_k", bias_k, mha.bias_k);
  adopt("bias_v", bias_v, mha.bias_v);
  out_proj = replace_module("out_proj", mha.out_proj);
}

void FusedMultiheadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "conveyor::FusedMultiheadAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", causal=" << (causal ? "true" : "false") << ")";
}

std::tuple<at::Tensor, at::Tensor> FusedMultiheadAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key,
                                                                        const at::Tensor& value,
                                                                        const at::Tensor& key_padding_mask,
                                                                        bool need_weights, const at::Tensor& attn_mask,
                                                                        bool average_attn_weights) {
  const int64_t E = options.embed_dim();
  TORCH_CHECK(query.dim() == 3 && query.size(2) == E, "FusedMultiheadAttention: query must be [L, N, embed_dim=", E,
              "], got ", query.sizes());
  TORCH_CHECK(key.dim() == 3 && key.size(1) == query.size(1) && key.size(2) == options.kdim(),
              "FusedMultiheadAttention: key must be [S, N=", query.size(1), ", kdim=", options.kdim(), "], got ",
              key.sizes());
  TORCH_CHECK(value.dim() == 3 && value.size(0) == key.size(0) && value.size(1) == query.size(1) &&
                  value.size(2) == options.vdim(),
              "FusedMultiheadAttention: value must be [S=", key.size(0), ", N=", query.size(1),
              ", vdim=", options.vdim(), "], got ", value.sizes());
  const at::Tensor padding = bool_key_padding_mask(key_padding_mask);

  bool use_math = need_weights || (is_training() && options.dropout() > 0);
  bool causal_now = causal;
  if (!use_math && attn_mask.defined()) {  // only a causal mask can run fused
    causal_now = is_causal_mask(attn_mask, query.size(0), key.size(0));
    use_math = !causal_now;
  }
  // The appended bias/zero keys would fall under the causal mask's upper triangle.
  use_math = use_math || (causal_now && (options.add_bias_kv() || options.add_zero_attn()));
  if (use_math) {
    return math_forward(query, key, value, padding, need_weights, attn_mask, average_attn_weights);
  }
  return {fused_forward(query, key, value, padding, causal_now), at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor> FusedMultiheadAttentionImpl::math_forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_padding_mask,
    bool need_weights, const at::Tensor& attn_mask, bool average_attn_weights) {
  at::Tensor mask = additive_mask(attn_mask, query.options());
  if (causal) {
    const at::Tensor causal_mask =
        additive_mask(above_diagonal(query.size(0), key.size(0), query.options()), query.options());
    mask = mask.defined() ? mask + causal_mask : causal_mask;
  }
  auto opts = F::MultiheadAttentionForwardFuncOptions(options.embed_dim(), options.num_heads(), in_proj_weight,
                                                      in_proj_bias, bias_k, bias_v, options.add_zero_attn(),
                                                      options.dropout(), out_proj->weight, out_proj->bias)
                  .training(is_training())
                  .key_padding_mask(key_padding_mask)
                  .need_weights(need_weights)
                  .attn_mask(mask)
                  .average_attn_weights(average_attn_weights);
  if (!_qkv_same_embed_dim) {
    opts.use_separate_proj_weight(true)
        .q_proj_weight(q_proj_weight)
        .k_proj_weight(k_proj_weight)
        .v_proj_weight(v_proj_weight);
  }
  return F::multi_head_attention_forward(query, key, value, opts);
}

at::Tensor FusedMultiheadAttentionImpl::fused_forward(const at::Tensor& query, const at::Tensor& key,
                                                      const at::Tensor& value, const at::Tensor& key_padding_mask,
                                                      bool causal_now) {
  const int64_t E = options.embed_dim(), H = options.num_heads();
  const int64_t L = query.size(0), N = query.size(1);
  auto bias = [&](int64_t i) {
    return in_proj_bias.defined() ? in_proj_bias.slice(0, i * E, (i + 1) * E) : at::Tensor();
  };
  at::Tensor q, k, v;
  if (!_qkv_same_embed_dim) {
    q = F::linear(query, q_proj_weight, bias(0));
    k = F::linear(key, k_proj_weight, bias(1));
    v = F::linear(value, v_proj_weight, bias(2));
  } else if (query.is_same(key) && key.is_same(value)) {  // self-attention: one projection GEMM
    const auto chunks = F::linear(query, in_proj_weight, in_proj_bias).chunk(3, -1);
    q = chunks[0];
    k = chunks[1];
    v = chunks[2];
  } else {
    q = F::linear(query, in_proj_weight.slice(0, 0, E), bias(0));
    k = F::linear(key, in_proj_weight.slice(0, E, 2 * E), bias(1));
    v = F::linear(value, in_proj_weight.slice(0, 2 * E), bias(2));
  }
  at::Tensor mask = key_padding_mask;
  auto extend_mask = [&] {
    if (mask.defined()) mask = at::cat({mask, at::zeros({N, 1}, mask.options())}, 1);
  };
  if (bias_k.defined()) {  // one learned key/value appended to every sequence
    k = at::cat({k, bias_k.repeat({1, N, 1})});
    v = at::cat({v, bias_v.repeat({1, N, 1})});
    extend_mask();
  }
  if (options.add_zero_attn()) {  // one all-zero key/value appended
    k = at::cat({k, at::zeros({1, N, E}, k.options())});
    v = at::cat({v, at::zeros({1, N, E}, v.options())});
    extend_mask();
  }
  // [len, N, E] -> [N, H, len, head_dim]
  auto split_heads = [&](const at::Tensor& t) { return t.reshape({t.size(0), N, H, head_dim}).permute({1, 2, 0, 3}); };
  const at::Tensor attended =
      dispatched_attention(split_heads(q), split_heads(k), split_heads(v),
                           mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, causal_now, std::nullopt);
  return out_proj(attended.permute({2, 0, 1, 3}).reshape({L, N, E}));
}

}  // namespace conveyor
