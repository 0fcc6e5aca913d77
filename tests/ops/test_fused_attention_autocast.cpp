// EncoderLayer under autocast: LibTorch's C++ MultiheadAttention cannot
// mask a bf16 tensor, so the layer runs it in fp32 (the BERT example's
// --autocast bf16 depends on it). Part of test_fused_attention, which the
// builds without the fused ops leave out with the layer itself.
#include "ops/fused_attention/encoder_layer.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace conveyor {
namespace {

TEST(EncoderLayerAutocast, WithAPaddingMaskRunsItsAttentionInFp32) {
  // LibTorch's C++ MultiheadAttention masks in float and double only: under
  // autocast EncoderLayer runs it in fp32 instead of failing on bf16.
  torch::manual_seed(15);
  EncoderLayer layer(torch::nn::TransformerEncoderLayerOptions(16, 2).dim_feedforward(32).dropout(0.0));
  const at::Tensor x = torch::randn({5, 3, 16});
  at::Tensor pad = torch::zeros({3, 5}, torch::kBool);
  pad[0][4] = true;
  const at::Tensor fp32 = layer->forward(x, at::Tensor(), pad);
  at::Tensor low;
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
  at::autocast::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
  try {
    low = layer->forward(x, at::Tensor(), pad);
  } catch (...) {
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
    throw;
  }
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
  at::autocast::clear_cache();
  EXPECT_LE((low.to(at::kFloat) - fp32).abs().max().item<double>(), 0.1);
}

}  // namespace
}  // namespace conveyor
