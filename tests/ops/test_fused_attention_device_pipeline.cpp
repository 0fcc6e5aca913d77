// A small transformer language model whose encoder layers' attention runs
// the fused op, pipelined on one device (a GPU where there is one):
// tests/device_pipeline_checks.h. Sequence-first, as EncoderLayer takes it:
// the batch is dim 1.
#include "device_pipeline_checks.h"
#include "ops/fused_attention/encoder_layer.h"
#include "ops/swap.h"

namespace conveyor {
namespace {

testing::DevicePipelineModel swapped_transformer() {
  testing::DevicePipelineModel m;
  m.make = [] {
    const auto layer = torch::nn::TransformerEncoderLayerOptions(32, 2).dim_feedforward(64).dropout(0.0);
    torch::nn::Sequential model(torch::nn::Embedding(testing::kVocab, 32), EncoderLayer(layer), EncoderLayer(layer),
                                EncoderLayer(layer), torch::nn::Linear(32, testing::kVocab));
    model->to(torch::kFloat64);
    EXPECT_EQ(swap_fused_ops(model.ptr()).swapped.size(), 3u);
    return model;
  };
  torch::manual_seed(4);
  m.input = torch::randint(testing::kVocab, {9, 8});  // [S, N]
  m.target = torch::randint(testing::kVocab, {9, 8});
  m.loss = testing::lm_loss;
  m.batch_dim = 1;
  return m;
}

using FusedAttentionDevicePipeline = testing::FusedKernelsEverywhere;

TEST_F(FusedAttentionDevicePipeline, ExactGradientsWithWorkersOnOneDevice) {
  testing::check_exact_gradients(swapped_transformer(), testing::pipeline_test_device(), 4);
}

TEST_F(FusedAttentionDevicePipeline, FiveStepsWithTheCallersOptimizerMatchTheCpu) {
  testing::check_steps_match_cpu(swapped_transformer(), testing::pipeline_test_device(), 3);
}

}  // namespace
}  // namespace conveyor
