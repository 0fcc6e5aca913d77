// A pipelined language model whose LSTMs were swapped for the fused op keeps
// the unsplit, unswapped model's gradients under every synchronous schedule.
#include "ops/swap.h"
#include "plugin/pipeline.h"
#include "test_models.h"

namespace conveyor {
namespace {

TEST(FusedLstmPipeline, SwappedModelKeepsExactGradients) {
  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (int k = 2; k <= 4; ++k) {
      torch::manual_seed(20 + k);
      auto model = testing::make_lstm_lm();
      auto reference = testing::clone_of(model);
      const SwapReport report = swap_fused_ops(model.ptr());
      ASSERT_EQ(report.swapped.size(), 2u) << report.to_string();
      const at::Tensor x = torch::randint(testing::kVocab, {6, 5}), y = torch::randint(testing::kVocab, {6, 5});
      testing::lm_loss(reference->forward(x), y).backward();
      StageRunner pipe(model, PipelineOptions().workers(k).microbatches(3).schedule(schedule));
      const StepResult r = pipe.train_step(x, y, testing::lm_loss);
      testing::expect_same_grads(pipe, reference, 1e-10, 0, std::string(schedule) + " K=" + std::to_string(k));
      EXPECT_NEAR(r.loss, testing::lm_loss(reference->forward(x), y).item<double>(), 1e-12);
    }
  }
}

// The builder's fused_ops swaps torch::nn layers too, before it cuts them.
TEST(FusedLstmPipeline, TheBuildersFusedOpsSwapTorchNnLayers) {
  torch::manual_seed(7);
  auto model = testing::make_lstm_lm();
  auto reference = testing::clone_of(model);
  const TensorsLossFn loss = [](const Tensors& out, const Tensors& t) { return testing::lm_loss(out[0], t[0]); };
  Pipeline built(model, {.options = PipelineOptions().workers(2).microbatches(3).fused_ops(true),
                              .loss = loss});
  EXPECT_EQ(swap_fused_ops(model.ptr()).swapped.size(), 0u) << "the builder swapped both already";
  EXPECT_THAT(built.fused_ops_report(), ::testing::HasSubstr("swapped 2"));
  const at::Tensor x = torch::randint(testing::kVocab, {6, 5}), y = torch::randint(testing::kVocab, {6, 5});
  const at::Tensor ref_loss = testing::lm_loss(reference->forward(x), y);
  ref_loss.backward();
  EXPECT_NEAR(built.train_step({x}, {y}).loss, ref_loss.item<double>(), 1e-12);
  testing::expect_same_grads(built.runner(), reference, 1e-10, 0, "fused_ops");
}

}  // namespace
}  // namespace conveyor
