// TorchScript models cut anywhere: several forward arguments, every value
// live across a cut travels (an encoder's output crosses several cuts, a
// residual block is cut inside), a non-tensor across a cut is refused naming
// it, and a weight the model ties across stages is untied into copies kept
// identical. Fixtures from tests/python/make_fixtures.py.
#include "built_pipeline.h"
#include "error_of.h"
#include "plugin/script/torchscript.h"

#include "script_fixtures.h"
#include "test_models.h"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;
using testing::check_exact;
using testing::cross_entropy_of;
using testing::fixture;
using testing::mse_of;


TEST(ScriptTensors, ATwoArgumentForwardGivesTheUnsplitGradients) {
  REQUIRE_FIXTURES();
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({6, 8}, torch::kFloat64);
  const at::Tensor mask = (torch::rand({6, 8}) > 0.3).to(torch::kFloat64);
  const at::Tensor y = torch::randn({6, 3}, torch::kFloat64);
  // The mask and x are read after both cuts: they travel through every stage.
  for (const auto& cut : std::vector<std::vector<std::string>>{{"b"}, {"b", "c"}}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      for (int m : {1, 4}) {
        const std::string where = std::string(schedule) + " K=" + std::to_string(cut.size() + 1) + " M=" +
                                  std::to_string(m);
        check_exact("two_input.pt", {x, mask}, {y}, mse_of, cut, PipelineOptions().microbatches(m).schedule(schedule),
                    where);
      }
    }
  }
}

TEST(ScriptTensors, AnEncoderOutputCrossesTwoCutsToTheDecodersAttention) {
  REQUIRE_FIXTURES();
  torch::manual_seed(6);
  const at::Tensor src = torch::randint(30, {5, 7}), tgt = torch::randint(30, {5, 6}), y = torch::randint(30, {5, 6});
  for (const auto& cut : std::vector<std::vector<std::string>>{{"dec1", "dec2"}, {"attn1", "dec2", "attn2"}}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      check_exact("seq2seq.pt", {src, tgt}, {y}, cross_entropy_of, cut,
                  PipelineOptions().microbatches(3).schedule(schedule),
                  std::string(schedule) + " cut before " + cut[0]);
    }
  }
  // What crosses the first cut: the encoder's output and the target tokens.
  const auto layers = sequential_from_script(load_script(fixture("seq2seq.pt")), {"dec1", "dec2"});
  const auto* stage1 = dynamic_cast<ScriptLayerImpl*>(layers->ptr(1).get());
  ASSERT_NE(stage1, nullptr);
  EXPECT_EQ(stage1->num_inputs(), 2);
}

TEST(ScriptTensors, AScriptedResidualNetworkCutInsideABlock) {
  REQUIRE_FIXTURES();
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({6, 3, 8, 8}, torch::kFloat64), y = torch::randn({6, 5}, torch::kFloat64);
  // Inside block1 both the block's input (the residual) and its branch cross.
  for (const auto& cut : std::vector<std::vector<std::string>>{{"block1.conv2"}, {"block1.conv2", "block2.conv2"}}) {
    check_exact("resnet_scripted.pt", {x}, {y}, mse_of, cut, PipelineOptions().microbatches(3).schedule("1f1b"),
                "cut at " + cut.back());
  }
}

TEST(ScriptTensors, ANumberAcrossACutTravelsAsATensorAndOtherValuesAreRefused) {
  REQUIRE_FIXTURES();
  // n = x.size(1) // 2 is made in stage 0 and slices stage 1's output.
  torch::jit::Module model = load_script(fixture("non_tensor_cut.pt"));
  const auto pipe = testing::built_pipeline(model, PipelineOptions().microbatches(1), {"b"});
  const at::Tensor x = torch::randn({3, 8}, torch::kFloat64);
  const Tensors out = pipe->forward(Tensors{x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].allclose(model.forward({x}).toTensor(), 0, 1e-12)) << out[0].sizes();
  // A list of ints is no number: refused, naming it and the cut.
  const std::string msg = error_of([&] { sequential_from_script(load_script(fixture("list_cut.pt")), {"b"}); });
  EXPECT_THAT(msg, AllOf(HasSubstr("split point 'b'"), HasSubstr("(List[int])"),
                         HasSubstr("only tensors and numbers travel")));
}

TEST(ScriptTensors, AModuleCalledInTwoStagesIsRefusedNamingItsWeight) {
  REQUIRE_FIXTURES();
  // Its own code reads its weight, so no stage can be given a copy of it.
  const std::string msg = error_of([&] { sequential_from_script(load_script(fixture("shared_call.pt")), {"mid"}); });
  EXPECT_THAT(msg, AllOf(HasSubstr("'shared.weight' is used by stage 0 and, inside a submodule it calls, by stage 1"),
                         HasSubstr("keep the calls in one stage")));
}

TEST(ScriptTensors, SeveralArgumentsWithoutSplitPointsAskForThem) {
  REQUIRE_FIXTURES();
  const std::string msg = error_of([&] { sequential_from_script(load_script(fixture("two_input.pt"))); });
  EXPECT_THAT(msg, AllOf(HasSubstr("takes 2 arguments"), HasSubstr("give split points")));
}

TEST(ScriptTensors, AStageGivenFewerTensorsThanItsSegmentTakesNamesBothCounts) {
  REQUIRE_FIXTURES();
  const auto pipe = testing::built_pipeline(load_script(fixture("two_input.pt")), PipelineOptions().microbatches(2), {"b"});
  const at::Tensor x = torch::randn({4, 8}, torch::kFloat64);
  const std::string msg =
      error_of([&] { pipe->train_step(Tensors{x}, Tensors{torch::randn({4, 3}, torch::kFloat64)}, mse_of); });
  EXPECT_THAT(msg, AllOf(HasSubstr("stage 0"), HasSubstr("takes 2 tensors, but 1 reach it")));
}

// The model ties its projection to its embedding (proj.weight is
// embed.weight). Cut between them, each stage holds a copy; the copies get
// the summed gradient, equal to the unsplit model's, and stay identical.
TEST(ScriptTensors, AWeightTiedAcrossStagesIsUntiedIntoIdenticalCopies) {
  REQUIRE_FIXTURES();
  torch::manual_seed(8);
  const at::Tensor tokens = torch::randint(40, {6, 5}), y = torch::randint(40, {6, 5});
  torch::jit::Module ref = load_script(fixture("tied_lm.pt"));
  cross_entropy_of({ref.forward({tokens}).toTensor()}, {y}).backward();
  const at::Tensor ref_grad = ref.attr("embed").toModule().attr("weight").toTensor().grad();

  torch::jit::Module model = load_script(fixture("tied_lm.pt"));
  const auto pipe = testing::built_pipeline(model, PipelineOptions().workers(2).microbatches(3));
  ASSERT_EQ(pipe->tied_parameters().size(), 1u);
  pipe->train_step(Tensors{tokens}, Tensors{y}, cross_entropy_of);
  std::map<std::string, at::Tensor> params;
  for (const auto& [name, p] : model_named_parameters(*pipe)) params[name] = p;
  ASSERT_TRUE(params.count("embed.weight") && params.count("proj.weight"));
  EXPECT_NE(params["embed.weight"].unsafeGetTensorImpl(), params["proj.weight"].unsafeGetTensorImpl());
  EXPECT_LE((params["embed.weight"].grad() - ref_grad).abs().max().item<double>(), 1e-10);
  EXPECT_TRUE(torch::equal(params["embed.weight"].grad(), params["proj.weight"].grad()));

  torch::optim::SGD opt(pipe->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    opt.zero_grad();
    pipe->train_step(Tensors{tokens}, Tensors{y}, cross_entropy_of);
    opt.step();
  }
  EXPECT_TRUE(torch::equal(params["embed.weight"], params["proj.weight"]));
  EXPECT_FALSE(torch::equal(params["embed.weight"], ref.attr("embed").toModule().attr("weight").toTensor()));
}

// The output layer reads the embedding's own attribute (F.linear(h,
// self.embed.weight)) in the last stage, while stage 0 calls the embedding:
// the last stage's segment is fed its own copy instead of the attribute.
TEST(ScriptTensors, AnAttributeReadInTwoStagesIsFedAsATiedCopy) {
  REQUIRE_FIXTURES();
  torch::manual_seed(9);
  const at::Tensor tokens = torch::randint(40, {6, 5}), y = torch::randint(40, {6, 5});
  torch::jit::Module ref = load_script(fixture("tied_head_lm.pt"));
  cross_entropy_of({ref.forward({tokens}).toTensor()}, {y}).backward();
  const at::Tensor ref_grad = ref.attr("embed").toModule().attr("weight").toTensor().grad();
  for (const auto& cut : std::vector<std::vector<std::string>>{{"rnn2"}, {"rnn1", "rnn2"}}) {
    const auto pipe =
        testing::built_pipeline(load_script(fixture("tied_head_lm.pt")), PipelineOptions().microbatches(3), cut);
    ASSERT_EQ(pipe->tied_parameters().size(), 1u);
    pipe->train_step(Tensors{tokens}, Tensors{y}, cross_entropy_of);
    const at::Tensor& first = pipe->stage(0).live()[0];
    const at::Tensor& last = pipe->stage(pipe->num_stages() - 1).live().back();
    ASSERT_TRUE(first.sizes().equals(last.sizes()));
    EXPECT_NE(first.unsafeGetTensorImpl(), last.unsafeGetTensorImpl());
    EXPECT_LE((first.grad() - ref_grad).abs().max().item<double>(), 1e-10) << cut.size() + 1 << " stages";
    EXPECT_TRUE(torch::equal(first.grad(), last.grad()));
  }
}

}  // namespace
}  // namespace conveyor
