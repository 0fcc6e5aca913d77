// The language model with its LSTMs swapped for the fused op, pipelined on
// one device (a GPU where there is one): tests/device_pipeline_checks.h.
#include "device_pipeline_checks.h"
#include "ops/swap.h"

namespace conveyor {
namespace {

testing::DevicePipelineModel swapped_lstm_lm() {
  testing::DevicePipelineModel m;
  m.make = [] {
    auto model = testing::make_lstm_lm();
    EXPECT_EQ(swap_fused_ops(model.ptr()).swapped.size(), 2u);
    return model;
  };
  torch::manual_seed(3);
  m.input = torch::randint(testing::kVocab, {8, 7});
  m.target = torch::randint(testing::kVocab, {8, 7});
  m.loss = testing::lm_loss;
  return m;
}

using FusedLstmDevicePipeline = testing::FusedKernelsEverywhere;

TEST_F(FusedLstmDevicePipeline, ExactGradientsWithWorkersOnOneDevice) {
  testing::check_exact_gradients(swapped_lstm_lm(), testing::pipeline_test_device(), 4);
}

TEST_F(FusedLstmDevicePipeline, FiveStepsWithTheCallersOptimizerMatchTheCpu) {
  testing::check_steps_match_cpu(swapped_lstm_lm(), testing::pipeline_test_device(), 3);
}

}  // namespace
}  // namespace conveyor
