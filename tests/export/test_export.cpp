// torch.export programs (.pt2) trained in the pipeline against eager PyTorch:
// tests/python/make_export_fixtures.py exports each model in training mode
// with a dynamic batch and records what eager PyTorch computes on a batch of
// 10 split into 4 micro-batches (3, 3, 2, 2 samples): the loss, every
// gradient, and every parameter and buffer after three SGD steps. The
// pipeline, cut into K = 2..4 stages under every synchronous schedule, must
// match all of it in float64 to 1e-10; the asynchronous schedules must train
// as they do a torch::nn twin of the model. The same models across processes:
// test_export_ranks.cpp.
#include "built_pipeline.h"
#include "export/export_cases.h"
#include "plugin/pipeline.h"
#include "plugin/export/exported.h"
#include "plugin/model/model_names.h"
#include "error_of.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;
using testing::export_case;
using testing::export_loss;
using testing::ExportCase;
using testing::invalid_argument_of;
using testing::numbered;

std::string fixture(const std::string& name) { return testing::export_fixture(name); }
testing::NamedTensors reference(const std::string& model) { return testing::export_reference(model); }

// Three SGD steps of the pipeline against eager PyTorch's.
void check_against_eager(const ExportCase& c, const std::vector<std::string>& split, const PipelineOptions& options,
                         const std::string& label) {
  const std::string where = c.model + " cut at " + c10::Join(",", split) + " under " + label;
  const auto ref = reference(c.model);
  const Tensors inputs = numbered(ref, "input."), targets = numbered(ref, "target.");
  auto pipe = testing::built_pipeline(load_exported(fixture(c.model + ".pt2")), options, split);
  ASSERT_EQ(pipe->num_stages(), static_cast<int>(split.size()) + 1) << where;
  torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    const StepResult r = pipe->train_step(inputs, targets, export_loss(c.cross_entropy));
    if (step == 0) {
      EXPECT_NEAR(r.loss, ref.at("loss").item<double>(), 1e-10) << where;
      std::vector<std::pair<std::string, at::Tensor>> grads;
      for (const auto& [name, p] : model_named_parameters(*pipe)) grads.emplace_back(name, p.grad());
      EXPECT_EQ(grads.size(), testing::count_prefixed(ref, "grad.")) << where << ": every parameter, once";
      testing::expect_like_reference(grads, ref, "grad.", where);
    }
    sgd.step();
  }
  auto state = model_named_parameters(*pipe);
  for (auto& b : model_named_buffers(*pipe)) state.push_back(b);
  EXPECT_EQ(state.size(), testing::count_prefixed(ref, "step3.")) << where << ": every parameter and buffer, once";
  testing::expect_like_reference(state, ref, "step3.", where + " after 3 steps");
}

class ExportedModels : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportedModels, TrainLikeEagerPyTorchUnderGpipeAnd1f1bAtTwoToFourStages) {
  REQUIRE_EXPORT_FIXTURES();
  const ExportCase& c = export_case(GetParam());
  for (const auto& split : c.splits) {
    for (const std::string schedule : {"gpipe", "1f1b"}) {
      check_against_eager(c, split, PipelineOptions().microbatches(4).schedule(schedule), schedule);
    }
  }
}

// The other synchronous schedules, with recomputation and offloading: K = 3,
// or 2 workers of 2 chunks each for the interleaved ones.
TEST_P(ExportedModels, TrainLikeEagerPyTorchUnderEveryOtherSynchronousSchedule) {
  REQUIRE_EXPORT_FIXTURES();
  const ExportCase& c = export_case(GetParam());
  const PipelineOptions m4 = PipelineOptions().microbatches(4);
  const std::vector<std::pair<std::string, PipelineOptions>> schedules = {
      {"sequential", PipelineOptions(m4).schedule("sequential")},
      {"eager-1f1b", PipelineOptions(m4).schedule("eager-1f1b").lookahead(1)},
      {"zb-h1", PipelineOptions(m4).schedule("zb-h1")},
      {"1f1b+recompute", PipelineOptions(m4).schedule("1f1b").recompute(true)},
      {"1f1b+offload", PipelineOptions(m4).schedule("1f1b").offload(true)},
      {"interleaved", PipelineOptions(m4).schedule("interleaved").workers(2)},
      {"zb-interleaved", PipelineOptions(m4).schedule("zb-interleaved").workers(2)}};
  for (const auto& [label, options] : schedules) {
    const bool interleaved = label.find("interleaved") != std::string::npos;
    check_against_eager(c, c.splits[interleaved ? 2 : 1], options, label);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExportedModels,
                         ::testing::Values("mlp", "lstm_lm", "resblock", "transformer", "seq2seq"));

// The exported MLP as torch::nn layers with its weights: body.0 .. body.5, head.
torch::nn::Sequential nn_twin_of_mlp(const ExportedModel& model) {
  torch::nn::Sequential twin(torch::nn::Linear(12, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                             torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 5));
  twin->to(torch::kFloat64);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : twin->named_parameters().pairs()) {  // "6.weight" is "head.weight", "2.bias" "body.2.bias"
    const std::string layer = name.substr(0, name.find('.'));
    p.copy_(model.tensors.at((layer == "6" ? "head" : "body." + layer) + name.substr(name.find('.'))));
  }
  return twin;
}

TEST(ExportedProgram, AsynchronousSchedulesTrainAsTheyDoATorchNnModel) {
  REQUIRE_EXPORT_FIXTURES();
  const auto sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
  const auto ref = reference("mlp");
  const Tensors x = numbered(ref, "input."), y = numbered(ref, "target.");
  for (const char* schedule : {"pipedream", "ddg", "fr"}) {
    const auto options = PipelineOptions().microbatches(4).schedule(schedule).optimizer(sgd);
    const ExportedModel model = load_exported(fixture("mlp.pt2"));
    StageRunner twin(nn_twin_of_mlp(model), PipelineOptions(options).boundaries({4}));
    const auto pipe = testing::built_pipeline(model, options, {"body.4"});
    for (int step = 0; step < 3; ++step) {
      pipe->train_step(x, y, export_loss(false));
      twin.train_step(x, y, export_loss(false));
    }
    const auto got = model_named_parameters(*pipe);
    const auto want = twin.named_parameters();
    ASSERT_EQ(got.size(), want.size()) << schedule;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LE((got[i].second - want[i].second).abs().max().item<double>(), 1e-10)
          << schedule << ": " << got[i].first << " vs " << want[i].first;
    }
    const at::Tensor initial = load_exported(fixture("mlp.pt2")).tensors.at("body.0.weight");
    EXPECT_GT((got[0].second - initial).abs().max().item<double>(), 1e-4) << schedule << ": the weights did not move";
  }
}

TEST(ExportedProgram, WithoutSplitPointsEachCalledModuleIsALayer) {
  REQUIRE_EXPORT_FIXTURES();
  const auto layers = sequential_from_export(load_exported(fixture("seq2seq.pt2")));
  std::vector<std::string> names;
  for (const auto& item : layers->named_children()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"src_embed", "encoder", "tgt_embed", "decoder", "attend", "combine",
                                             "out"}));
  // Balanced by parameters over 3 workers, the step is eager PyTorch's.
  const auto ref = reference("seq2seq");
  auto pipe = std::make_unique<StageRunner>(layers, PipelineOptions().workers(3).microbatches(4).schedule("1f1b"));
  const StepResult r = pipe->train_step(numbered(ref, "input."), numbered(ref, "target."), export_loss(true));
  EXPECT_NEAR(r.loss, ref.at("loss").item<double>(), 1e-10);
  for (const auto& [name, p] : model_named_parameters(*pipe)) {
    EXPECT_LE((p.grad() - ref.at("grad." + name)).abs().max().item<double>(), 1e-10) << name;
  }
}

TEST(ExportedProgram, EvaluationModeLeavesBatchNormStatisticsAlone) {
  REQUIRE_EXPORT_FIXTURES();
  const auto ref = reference("resblock");
  auto pipe = testing::built_pipeline(load_exported(fixture("resblock.pt2")), PipelineOptions().microbatches(2),
                                   {"block"});
  const auto before = model_named_buffers(*pipe);
  std::vector<at::Tensor> saved;
  for (const auto& [name, t] : before) saved.push_back(t.clone());
  pipe->eval();
  const at::Tensor a = pipe->forward(numbered(ref, "input."))[0];
  const at::Tensor b = pipe->forward(numbered(ref, "input."))[0];
  EXPECT_TRUE(a.equal(b));
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(before[i].second.equal(saved[i])) << before[i].first;
  pipe->train();
  pipe->forward(numbered(ref, "input."));
  EXPECT_FALSE(before[0].second.equal(saved[0])) << "training mode updates " << before[0].first;
}

// GPT-2's lm_head.weight is its transformer.wte.weight: torch.export.save
// writes the tensor once under both names, and the program reads both.
TEST(ExportedProgram, ATiedWeightIsOneParameterByItsFirstNameUnderEveryStateDictKey) {
  REQUIRE_EXPORT_FIXTURES();
  const auto ref = reference("tied_lm");
  const ExportedModel model = load_exported(fixture("tied_lm.pt2"));
  EXPECT_EQ(model.aliases, (std::vector<std::pair<std::string, std::string>>{{"head.weight", "embed.weight"}}));
  EXPECT_EQ(model.tensors.count("scale"), 1u) << "the non-persistent buffer, from the archive's constants";
  Pipeline pipe(model.path, {.options = PipelineOptions().microbatches(4).split_points({"head"}),
                                  .loss = export_loss(true)});
  std::vector<std::string> names;
  for (const auto& [name, p] : pipe.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed.weight", "body.0.weight", "body.0.bias"}));
  std::vector<std::string> keys;
  for (const auto& [name, t] : pipe.state_dict()) keys.push_back(name);
  EXPECT_EQ(keys, (std::vector<std::string>{"embed.weight", "body.0.weight", "body.0.bias", "head.weight"}))
      << "every key of the model's state_dict(), no non-persistent buffer";
  // A caller's optimizer steps the one parameter; the pipeline keeps the head's copy equal to it.
  torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    const StepResult& r = pipe.train_step(numbered(ref, "input."), numbered(ref, "target."));
    if (step == 0) {
      EXPECT_NEAR(r.loss, ref.at("loss").item<double>(), 1e-10);
      std::vector<std::pair<std::string, at::Tensor>> grads;
      for (const auto& [name, p] : pipe.named_parameters()) grads.emplace_back(name, p.grad());
      testing::expect_like_reference(grads, ref, "grad.", "tied_lm");
    }
    sgd.step();
  }
  // Steps 2 and 3 read the head's copy: unrefreshed, the weights would differ.
  testing::expect_like_reference(pipe.state_dict(), ref, "step3.", "tied_lm after 3 steps");
}

TEST(ExportedProgram, BadArchivesAreRefusedByName) {
  REQUIRE_EXPORT_FIXTURES();
  EXPECT_THAT(invalid_argument_of([] { load_exported(fixture("missing.pt2")); }), HasSubstr("no such file"));
  EXPECT_THAT(invalid_argument_of([] { load_exported(fixture("truncated.pt2")); }), HasSubstr("is no zip archive"));
  EXPECT_THAT(invalid_argument_of([] { load_exported(fixture("foreign.pt2")); }),
              AllOf(HasSubstr("holds no ExportedProgram"), HasSubstr("TorchScript")));
  EXPECT_THAT(invalid_argument_of([] { load_exported(fixture("future.pt2")); }),
              AllOf(HasSubstr("schema version 99."), HasSubstr("this build reads version 8")));
  EXPECT_THAT(invalid_argument_of([] { load_exported(fixture("custom_op.pt2")); }),
              AllOf(HasSubstr("node 'twice'"), HasSubstr("conveyor_test::twice"), HasSubstr("no library loaded")));
}

TEST(ExportedProgram, BadSplitsAndBatchesAreRefusedByName) {
  REQUIRE_EXPORT_FIXTURES();
  const ExportedModel mlp = load_exported(fixture("mlp.pt2"));
  EXPECT_THAT(invalid_argument_of([&] { sequential_from_export(mlp, {"body.9"}); }),
              AllOf(HasSubstr("split point 'body.9' names no module"), HasSubstr("body.0, body.1")));
  EXPECT_THAT(invalid_argument_of([&] { sequential_from_export(mlp, {"head", "body.2"}); }),
              HasSubstr("split point 'body.2' names no module the program calls after 'head'"));
  EXPECT_THAT(invalid_argument_of([&] { sequential_from_export(mlp, {"body.0"}); }),
              HasSubstr("it begins the program"));
  EXPECT_THAT(invalid_argument_of([&] {
                testing::built_pipeline(mlp, PipelineOptions().schedule("interleaved").workers(3), {"body.2", "head"});
              }),
              HasSubstr("2 split points make 3 stages, but the options ask for 3 workers of 2 chunks each"));
  const auto ref = reference("mlp");
  auto pipe = testing::built_pipeline(load_exported(fixture("static_batch.pt2")), PipelineOptions().microbatches(4),
                                   {"head"});
  const auto step = [&] { pipe->train_step(numbered(ref, "input."), numbered(ref, "target."), export_loss(false)); };
  EXPECT_THAT(error_of(step),
              AllOf(HasSubstr("exported with size 8 in dimension 0, got 3"), HasSubstr("dynamic")));
}

}  // namespace
}  // namespace conveyor
