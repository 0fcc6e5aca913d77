// TorchScript models in the pipeline: the layers share the model's tensors
// and names, every synchronous schedule gives the unsplit model's gradients,
// split points cut where asked, and bad input is refused with a clear error.
// The models come from tests/python/make_fixtures.py (env CONVEYOR_FIXTURES).
#include "built_pipeline.h"
#include "error_of.h"
#include "plugin/script/torchscript.h"

#include "script_fixtures.h"
#include "test_models.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::expect_same_grads;
using testing::fixture;

struct Case {
  const char* file;
  at::Tensor input, target;
  LossFn loss;
};

Case make_case(const std::string& file) {
  torch::manual_seed(3);
  if (file == "mlp.pt")
    return {"mlp.pt", torch::randn({12, 8}, torch::kFloat64), torch::randn({12, 3}, torch::kFloat64), testing::mse};
  if (file == "lstm_lm.pt") {
    return {"lstm_lm.pt", torch::randint(testing::kVocab, {6, 5}), torch::randint(testing::kVocab, {6, 5}),
            testing::lm_loss};
  }
  if (file == "resnet.pt") {
    return {"resnet.pt", torch::randn({8, 3, 8, 8}, torch::kFloat64), torch::randn({8, 5}, torch::kFloat64),
            testing::mse};
  }
  return {"nonchain.pt", torch::randn({10, 8}, torch::kFloat64), torch::randn({10, 3}, torch::kFloat64), testing::mse};
}

// Gradients of the unsplit model (a second, independent load of the file) and its loss.
std::pair<torch::jit::Module, double> reference_grads(const Case& c) {
  torch::jit::Module ref = load_script(fixture(c.file));
  const at::Tensor loss = c.loss(ref.forward({c.input}).toTensor(), c.target);
  loss.backward();
  return {ref, loss.item<double>()};
}

void check_exact(const std::string& file, const PipelineOptions& options, const std::vector<std::string>& split_points,
                 const std::string& where) {
  const Case c = make_case(file);
  const auto [ref, ref_loss] = reference_grads(c);
  const auto pipe = testing::built_pipeline(load_script(fixture(file)), options, split_points);
  const StepResult r = pipe->train_step(c.input, c.target, c.loss);
  expect_same_grads(*pipe, ref, 1e-10, where);
  EXPECT_NEAR(r.loss, ref_loss, 1e-10) << where;
}

TEST(ScriptPipeline, ChainModelsGiveTheUnsplitGradientsAtEveryStageCount) {
  REQUIRE_FIXTURES();
  for (const char* file : {"mlp.pt", "lstm_lm.pt", "resnet.pt"}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      for (int k = 2; k <= 4; ++k) {
        const std::string where = std::string(file) + " " + schedule + " K=" + std::to_string(k);
        check_exact(file, PipelineOptions().workers(k).microbatches(3).schedule(schedule), {}, where);
      }
    }
  }
}

TEST(ScriptPipeline, LayersShareTheModelsTensorsAndNames) {
  REQUIRE_FIXTURES();
  torch::jit::Module model = load_script(fixture("mlp.pt"));
  const auto pipe = testing::built_pipeline(model, PipelineOptions().workers(2));
  std::vector<std::string> names;
  for (const auto& [name, p] : pipe->named_parameters()) names.push_back(name);
  EXPECT_THAT(names,
              ::testing::ElementsAre("stem.weight", "stem.bias", "encoder.layer1.weight", "encoder.layer1.bias",
                                     "encoder.layer2.weight", "encoder.layer2.bias", "head.weight", "head.bias"));
  std::map<std::string, at::Tensor> script;
  for (const auto& p : model.named_parameters()) script[p.name] = p.value;
  for (const auto& [name, p] : pipe->named_parameters()) {
    EXPECT_EQ(p.unsafeGetTensorImpl(), script.at(name).unsafeGetTensorImpl()) << name;
  }
  // An optimizer over the pipeline's parameters updates the TorchScript model.
  torch::optim::SGD opt(pipe->parameters(), 0.5);
  const Case c = make_case("mlp.pt");
  const at::Tensor before = model.forward({c.input}).toTensor();
  pipe->train_step(c.input, c.target, c.loss);
  opt.step();
  EXPECT_GT((model.forward({c.input}).toTensor() - before).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(pipe->stage(0).module()->named_children()[0].key(), "stem");
}

TEST(ScriptPipeline, NestedSplitPointsCutInsideASubmodule) {
  REQUIRE_FIXTURES();
  const std::vector<std::string> split = {"encoder.layer2", "head"};
  EXPECT_EQ(split_point_boundaries(split), (std::vector<int64_t>{1, 2}));
  for (const char* schedule : {"gpipe", "1f1b"}) {
    check_exact("mlp.pt", PipelineOptions().microbatches(4).schedule(schedule), split,
                std::string("nested ") + schedule);
  }
  const auto pipe = testing::built_pipeline(load_script(fixture("mlp.pt")), PipelineOptions(), split);
  ASSERT_EQ(pipe->num_stages(), 3);
  std::vector<std::string> stage1;
  for (const auto& p : pipe->stage(1).module()->named_parameters()) stage1.push_back(p.key());
  EXPECT_THAT(stage1, ::testing::ElementsAre("stage1.encoder.layer2.weight", "stage1.encoder.layer2.bias"));
  std::vector<std::string> names;
  for (const auto& [name, p] : model_named_parameters(*pipe)) names.push_back(name);
  EXPECT_THAT(names,
              ::testing::ElementsAre("stem.weight", "stem.bias", "encoder.layer1.weight", "encoder.layer1.bias",
                                     "encoder.layer2.weight", "encoder.layer2.bias", "head.weight", "head.bias"));
}

TEST(ScriptPipeline, SplitPointsPipelineAForwardThatIsNoChain) {
  REQUIRE_FIXTURES();
  // a -> (b, residual add, tanh) -> c: the add lands inside a stage.
  check_exact("nonchain.pt", PipelineOptions().microbatches(3).schedule("1f1b"), {"b"}, "nonchain {b}");
  check_exact("nonchain.pt", PipelineOptions().microbatches(2).schedule("gpipe"), {"b", "c"}, "nonchain {b, c}");
  check_exact("resnet.pt", PipelineOptions().microbatches(2), {"block1", "head"}, "resnet {block1, head}");
}

// mlp.pt's chain (stem, encoder = layer1, act, layer2, act, head) as flat
// torch::nn layers with the same weights; boundaries({4}) splits it where the
// script pipeline's two stages meet (stem + encoder | act + head).
torch::nn::Sequential nn_twin_of_mlp(const torch::jit::Module& script) {
  torch::nn::Sequential twin(torch::nn::Linear(8, 16), torch::nn::Linear(16, 16), torch::nn::Tanh(),
                             torch::nn::Linear(16, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  twin->to(torch::kFloat64);
  const auto from = script.parameters();
  const auto to = twin->parameters();
  EXPECT_EQ(from.size(), to.size());
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const at::Tensor& p : from) to.at(i++).copy_(p);
  return twin;
}

TEST(ScriptPipeline, AsynchronousSchedulesTrainAsTheyDoATorchNnModel) {
  REQUIRE_FIXTURES();
  const auto sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  for (const char* schedule : {"pipedream", "ddg", "fr"}) {
    const auto options = PipelineOptions().workers(2).microbatches(4).schedule(schedule).optimizer(sgd);
    const torch::jit::Module model = load_script(fixture("mlp.pt"));
    StageRunner twin(nn_twin_of_mlp(model), PipelineOptions(options).workers(0).boundaries({4}));
    const auto pipe = testing::built_pipeline(model, options);
    torch::manual_seed(4);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor x = torch::randn({8, 8}, torch::kFloat64);
      const at::Tensor y = torch::randn({8, 3}, torch::kFloat64);
      pipe->train_step(x, y, testing::mse);
      twin.train_step(x, y, testing::mse);
    }
    const auto got = model_named_parameters(*pipe);
    const auto want = twin.named_parameters();
    ASSERT_EQ(got.size(), want.size()) << schedule;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE((got[i].second - want[i].second).abs().max().item<double>(), 1e-12)
          << schedule << ": " << got[i].first << " vs " << want[i].first;
    }
    EXPECT_FALSE(torch::equal(got[0].second, load_script(fixture("mlp.pt")).parameters().begin().operator*()))
        << schedule << ": the weights did not move";
  }
}

TEST(ScriptPipeline, ForwardIsInferenceAndMatchesTheModel) {
  REQUIRE_FIXTURES();
  const Case c = make_case("lstm_lm.pt");
  torch::jit::Module ref = load_script(fixture(c.file));
  const auto pipe = testing::built_pipeline(load_script(fixture(c.file)), PipelineOptions().workers(3).microbatches(2));
  const at::Tensor out = pipe->forward(c.input);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_LE((out - ref.forward({c.input}).toTensor()).abs().max().item<double>(), 1e-12);
}

TEST(ScriptPipeline, TrainAndEvalReachTheTorchScriptCode) {
  REQUIRE_FIXTURES();
  torch::jit::Module model = load_script(fixture("dropout_mlp.pt"));
  const auto pipe = testing::built_pipeline(model, PipelineOptions().workers(2));
  const at::Tensor x = torch::randn({16, 8}, torch::kFloat64);
  pipe->eval();
  EXPECT_FALSE(model.attr("drop").toModule().is_training());
  const at::Tensor a = pipe->forward(x), b = pipe->forward(x);
  EXPECT_TRUE(torch::equal(a, b));
  pipe->train();
  EXPECT_TRUE(model.attr("drop").toModule().is_training());
  EXPECT_FALSE(torch::equal(pipe->forward(x), a));  // dropout is on again
}

TEST(ScriptPipeline, CloneOfTheLayersIsDeep) {
  REQUIRE_FIXTURES();
  torch::nn::Sequential layers = sequential_from_script(load_script(fixture("mlp.pt")));
  ASSERT_EQ(layers->size(), 4u);
  // Sequential::clone numbers its layers anew: compare in order.
  torch::nn::Sequential copy = testing::clone_of(layers);
  const auto original = layers->parameters();
  const auto cloned = copy->parameters();
  ASSERT_EQ(cloned.size(), original.size());
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_NE(cloned[i].data_ptr(), original[i].data_ptr()) << i;
    EXPECT_TRUE(torch::equal(cloned[i], original[i])) << i;
  }
  EXPECT_EQ(copy->named_parameters()[2].key(), "1.layer1.weight");
  // Script layers take and return Tensors, like every layer of several tensors.
  const Tensors x{torch::randn({4, 8}, torch::kFloat64)};
  EXPECT_TRUE(torch::equal(copy->forward<Tensors>(x)[0], layers->forward<Tensors>(x)[0]));
}

TEST(ScriptPipeline, AFailingLayerIsNamedWithItsStage) {
  REQUIRE_FIXTURES();
  const auto pipe = testing::built_pipeline(load_script(fixture("mlp.pt")), PipelineOptions().workers(2).microbatches(2));
  try {
    pipe->train_step(torch::randn({4, 8}, torch::kFloat64), torch::randn({4, 5}, torch::kFloat64), testing::mse);
    FAIL() << "a target of the wrong width must fail";
  } catch (const PipelineError& e) {
    EXPECT_EQ(e.stage(), 1);
    EXPECT_THAT(e.what(), HasSubstr("stage 1"));
  }
  try {
    pipe->forward(torch::randn({4, 7}, torch::kFloat64));
    FAIL() << "an input of the wrong width must fail";
  } catch (const PipelineError& e) {
    EXPECT_EQ(e.stage(), 0);
    EXPECT_THAT(e.what(), AllOf(HasSubstr("stage 0"), HasSubstr("layer stem"), HasSubstr("conveyor::ScriptLayer")));
  }
}

using testing::invalid_argument_of;

TEST(ScriptErrors, UnloadableFilesNameThePathAndTheProblem) {
  REQUIRE_FIXTURES();
  const std::string corrupt = fixture("corrupt.pt");
  EXPECT_THAT(invalid_argument_of([&] { load_script(corrupt); }),
              AllOf(HasSubstr("'" + corrupt + "'"), HasSubstr("not a readable zip archive"), HasSubstr("truncated")));
  const std::string pickle = fixture("not_script.pt");
  EXPECT_THAT(invalid_argument_of([&] { load_script(pickle); }),
              AllOf(HasSubstr("'" + pickle + "'"), HasSubstr("torch.save"), HasSubstr("no TorchScript code")));
  const auto noise =
      std::filesystem::temp_directory_path() / ("conveyor_random_bytes_" + std::to_string(::getpid()) + ".pt");
  {
    std::ofstream out(noise, std::ios::binary);
    for (int i = 0; i < 4096; ++i) out.put(static_cast<char>((i * 7919) % 251));
  }
  EXPECT_THAT(invalid_argument_of([&] { load_script(noise.string()); }),
              AllOf(HasSubstr(noise.string()), HasSubstr("not a readable zip archive")));
  std::filesystem::remove(noise);
  EXPECT_THAT(invalid_argument_of([&] { load_script("/nonexistent/model.pt"); }),
              AllOf(HasSubstr("/nonexistent/model.pt"), HasSubstr("no such file")));
}

TEST(ScriptErrors, ANonChainForwardWithoutSplitPointsNamesTheNodeAndSuggestsSplitPoints) {
  REQUIRE_FIXTURES();
  const std::string msg = invalid_argument_of([&] { sequential_from_script(load_script(fixture("nonchain.pt"))); });
  EXPECT_THAT(msg, AllOf(HasSubstr("not a plain chain"), HasSubstr("the output of 'a' is used again"),
                         HasSubstr("aten::add at "), HasSubstr("make_fixtures.py:"), HasSubstr("x + y"),
                         HasSubstr("Give split points"), HasSubstr("split points that work here: b, c")));
}

TEST(ScriptErrors, BadSplitPointsAreNamed) {
  REQUIRE_FIXTURES();
  const torch::jit::Module mlp = load_script(fixture("mlp.pt"));
  EXPECT_THAT(invalid_argument_of([&] {
                sequential_from_script(mlp, {"encoder", "encoder.layer9"});
              }),
              AllOf(HasSubstr("split point 1 ('encoder.layer9') names no submodule"),
                    HasSubstr("'encoder' has no submodule 'layer9' (its submodules: layer1, act, layer2)")));
  EXPECT_THAT(invalid_argument_of([&] { sequential_from_script(mlp, {"decoder"}); }),
              AllOf(HasSubstr("split point 0 ('decoder') names no submodule"), HasSubstr("stem, encoder, act, head")));
  EXPECT_THAT(invalid_argument_of([&] {
                sequential_from_script(mlp, {"head", "encoder"});
              }),
              AllOf(HasSubstr("split points out of order"), HasSubstr("'encoder' is called before 'head'")));
  EXPECT_THAT(invalid_argument_of([&] { sequential_from_script(mlp, {"stem"}); }), HasSubstr("stage 0 would be empty"));
  EXPECT_THAT(invalid_argument_of([&] {
                testing::built_pipeline(mlp, PipelineOptions().workers(2), {"encoder", "head"});
              }),
              HasSubstr("2 split points make 3 stages, but the options ask for 2"));
}

}  // namespace
}  // namespace conveyor
