// Split points in models as a new user writes them (tests/python/cut_models.py):
// between the items of a ModuleList the forward loops over and inside an
// nn.Sequential it calls whole, at an nn.LSTM or nn.GRU called directly (a
// call of forward__0), inside a module whose forward is overloaded; and a
// [T, T] mask, refused as a split input with a message that names
// shared_inputs, goes whole to every micro-batch with it. Every cut gives
// the unsplit scripted model's own gradients.
#include "built_pipeline.h"
#include "error_of.h"
#include "plugin/script/torchscript.h"

#include "script_fixtures.h"
#include "test_models.h"

#include <limits>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;
using testing::check_exact;
using testing::cross_entropy_of;
using testing::fixture;
using testing::mse_of;


std::string cut_name(const std::vector<std::string>& cut) {
  std::string name;
  for (const auto& sp : cut) name += (name.empty() ? "{" : ", ") + sp;
  return name + "}";
}

// x [6, 5, 6] and its causal mask [5, 5]: 0 on and below the diagonal.
struct MaskedBatch {
  at::Tensor x, mask, y;
};

MaskedBatch masked_batch() {
  torch::manual_seed(11);
  return {torch::randn({6, 5, 6}, torch::kFloat64),
          torch::full({5, 5}, -std::numeric_limits<double>::infinity(), torch::kFloat64).triu(1),
          torch::randn({6, 5, 3}, torch::kFloat64)};
}

TEST(ScriptCuts, CutsBetweenTheItemsOfALoopedModuleListGiveTheUnsplitGradients) {
  REQUIRE_FIXTURES();
  const MaskedBatch b = masked_batch();
  // layers.0 .. layers.3 are called by the loop; ffn is an nn.Sequential called whole.
  const std::vector<std::vector<std::string>> cuts = {
      {"layers.1"}, {"layers.2"}, {"layers.1", "layers.3"}, {"layers.2", "ffn.2"}, {"layers.1", "layers.2", "head"}};
  for (const auto& cut : cuts) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      check_exact("looped_transformer.pt", {b.x, b.mask}, {b.y}, mse_of, cut,
                  PipelineOptions().microbatches(3).schedule(schedule).shared_inputs({1}),
                  "looped_transformer " + cut_name(cut) + " " + schedule);
    }
  }
}

TEST(ScriptCuts, EachStageHoldsTheLayersItRuns) {
  REQUIRE_FIXTURES();
  const auto pipe = testing::built_pipeline(load_script(fixture("looped_transformer.pt")),
                                         PipelineOptions().microbatches(2).shared_inputs({1}), {"layers.2"});
  std::vector<std::string> stage1;
  for (const auto& p : pipe->stage(1).module()->named_parameters()) stage1.push_back(p.key());
  std::vector<std::string> expected;
  for (const char* layer : {"layers.2", "layers.3"}) {
    for (const char* p : {"qkv.weight", "qkv.bias", "out.weight", "out.bias", "ff.weight", "ff.bias"}) {
      expected.push_back(std::string("stage1.") + layer + "." + p);
    }
  }
  for (const char* p : {"ffn.0.weight", "ffn.0.bias", "ffn.2.weight", "ffn.2.bias", "head.weight", "head.bias"}) {
    expected.push_back(std::string("stage1.") + p);
  }
  EXPECT_THAT(stage1, ::testing::UnorderedElementsAreArray(expected));
}

TEST(ScriptCuts, ADirectlyCalledLstmOrGruIsASplitPoint) {
  REQUIRE_FIXTURES();
  torch::manual_seed(12);
  const at::Tensor tokens = torch::randint(30, {6, 5}), y = torch::randint(30, {6, 5});
  for (const auto& cut : std::vector<std::vector<std::string>>{
           {"lstm"}, {"gru"}, {"lstm", "gru"}, {"gru", "head"}, {"lstm", "gru", "head"}}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      check_exact("direct_rnn.pt", {tokens}, {y}, cross_entropy_of, cut,
                  PipelineOptions().microbatches(3).schedule(schedule), "direct_rnn " + cut_name(cut) + " " + schedule);
    }
  }
}

TEST(ScriptCuts, ACutInsideAnOverloadedForwardInlinesTheOverloadCalled) {
  REQUIRE_FIXTURES();
  torch::manual_seed(13);
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  // block is called as forward__0 (no gate), gated as forward__1 (with one):
  // the module has no plain forward to inline.
  for (const auto& cut : std::vector<std::vector<std::string>>{
           {"block"}, {"block.b"}, {"gated.b"}, {"block.b", "gated"}, {"block.b", "gated.b"}}) {
    check_exact("overloaded_blocks.pt", {x}, {y}, mse_of, cut, PipelineOptions().microbatches(3).schedule("1f1b"),
                "overloaded_blocks " + cut_name(cut));
  }
}

TEST(ScriptCuts, AMaskWithoutSamplesIsRefusedNamingSharedInputs) {
  REQUIRE_FIXTURES();
  const MaskedBatch b = masked_batch();
  const auto pipe = testing::built_pipeline(load_script(fixture("looped_transformer.pt")),
                                         PipelineOptions().microbatches(3), {"layers.2"});
  EXPECT_THAT(error_of<std::invalid_argument>([&] { pipe->train_step(Tensors{b.x, b.mask}, Tensors{b.y}, mse_of); }),
              AllOf(HasSubstr("the input 1 has 5 samples along dimension 0 (shape [5, 5]), but the input 0 has 6"),
                    HasSubstr("pass it whole to every micro-batch with shared_inputs({1})"),
                    HasSubstr("\"shared_inputs\": [1]")));
  EXPECT_THAT(error_of<std::invalid_argument>([&] { pipe->forward(Tensors{b.x, b.mask}); }),
              HasSubstr("shared_inputs({1})"));
  // The same step with the mask shared.
  check_exact("looped_transformer.pt", {b.x, b.mask}, {b.y}, mse_of, {"layers.2"},
              PipelineOptions().microbatches(3).shared_inputs({1}), "looped_transformer, mask shared");
}

TEST(ScriptCuts, AnInputWithNoBatchDimensionIsRefusedNamingSharedInputs) {
  REQUIRE_FIXTURES();
  // two_input.pt multiplies by its mask, so a scalar works as one.
  torch::manual_seed(14);
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64), y = torch::randn({6, 3}, torch::kFloat64);
  const at::Tensor scale = torch::tensor(0.5, torch::kFloat64);
  const auto pipe =
      testing::built_pipeline(load_script(fixture("two_input.pt")), PipelineOptions().microbatches(2), {"b"});
  EXPECT_THAT(error_of<std::invalid_argument>([&] { pipe->train_step(Tensors{x, scale}, Tensors{y}, mse_of); }),
              AllOf(HasSubstr("the input 1 has shape [], which has no batch dimension 0"),
                    HasSubstr("pass it whole to every micro-batch with shared_inputs({1})")));
  EXPECT_THAT(error_of<std::invalid_argument>([&] { pipe->train_step(Tensors{x}, Tensors{y, scale}, mse_of); }),
              HasSubstr("shared_targets({1}) (the Python option \"shared_targets\": [1])"));
  check_exact("two_input.pt", {x, scale}, {y}, mse_of, {"b"}, PipelineOptions().microbatches(2).shared_inputs({1}),
              "two_input, scalar shared");
}

}  // namespace
}  // namespace conveyor
