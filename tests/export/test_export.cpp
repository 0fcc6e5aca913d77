// torch.export programs (.pt2) trained in the pipeline against eager PyTorch:
// tests/python/make_export_fixtures.py exports each model in training mode
// with a dynamic batch and records what eager PyTorch computes on a batch of
// 10 split into 4 micro-batches (3, 3, 2, 2 samples): the loss, every
// gradient, and every parameter and buffer after three SGD steps. The
// pipeline, cut into K = 2..4 stages under GPipe and 1F1B, must match all of
// it in float64 to 1e-10.
#include "plugin/export/exported.h"
#include "plugin/model_names.h"
#include "error_of.h"
#include "test_models.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;
using testing::invalid_argument_of;

std::string fixture(const std::string& name) {
  const char* dir = std::getenv("CONVEYOR_EXPORT_FIXTURES");
  return dir ? (std::filesystem::path(dir) / name).string() : std::string();
}

#define REQUIRE_EXPORT_FIXTURES()                                                                    \
  if (!std::getenv("CONVEYOR_EXPORT_FIXTURES")) {                                                   \
    GTEST_SKIP() << "CONVEYOR_EXPORT_FIXTURES is not set (ctest runs make_export_fixtures.py first)"; \
  }

// NAME.ref.pt: a dict of tensors, by the names the fixture script gives.
std::map<std::string, at::Tensor> reference(const std::string& name) {
  std::ifstream in(fixture(name + ".ref.pt"), std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> ref;
  for (const auto& item : torch::pickle_load(bytes).toGenericDict()) {
    ref.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return ref;
}

Tensors numbered(const std::map<std::string, at::Tensor>& ref, const std::string& prefix) {
  Tensors out;
  for (int i = 0; ref.count(prefix + std::to_string(i)); ++i) out.push_back(ref.at(prefix + std::to_string(i)));
  return out;
}

struct Case {
  std::string model;
  bool cross_entropy;
  std::vector<std::vector<std::string>> splits;  // for K = 2, 3, 4
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"mlp", false, {{"body.4"}, {"body.2", "body.4"}, {"body.2", "body.4", "head"}}},
      {"lstm_lm", true, {{"rnn2"}, {"rnn1", "rnn2"}, {"rnn1", "rnn2", "proj"}}},
      {"resblock", false, {{"block"}, {"block", "block.conv2"}, {"block.bn1", "block.conv2", "head"}}},
      {"transformer", false, {{"layers.1"}, {"layers.0", "layers.1"}, {"layers.0", "layers.1", "head"}}},
      {"seq2seq", true, {{"decoder"}, {"tgt_embed", "attend"}, {"encoder", "decoder", "combine"}}}};
  return all;
}

TensorsLossFn loss_of(bool cross_entropy) {
  if (cross_entropy) return [](const Tensors& o, const Tensors& t) { return testing::lm_loss(o[0], t[0]); };
  return [](const Tensors& o, const Tensors& t) { return torch::mse_loss(o[0], t[0]); };
}

// Three SGD steps of the pipeline against eager PyTorch's.
void check_against_eager(const Case& c, const std::vector<std::string>& split, const std::string& schedule) {
  const std::string where = c.model + " cut at " + c10::Join(",", split) + " under " + schedule;
  const auto ref = reference(c.model);
  const Tensors inputs = numbered(ref, "input."), targets = numbered(ref, "target.");
  auto pipe = make_export_pipeline(load_exported(fixture(c.model + ".pt2")),
                                   PipelineOptions().microbatches(4).schedule(schedule), split);
  ASSERT_EQ(pipe->num_stages(), static_cast<int>(split.size()) + 1) << where;
  torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(0.05));
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    const StepResult r = pipe->train_step(inputs, targets, loss_of(c.cross_entropy));
    if (step == 0) {
      EXPECT_NEAR(r.loss, ref.at("loss").item<double>(), 1e-10) << where;
      const auto params = model_named_parameters(*pipe);
      ASSERT_FALSE(params.empty()) << where;
      for (const auto& [name, p] : params) {
        ASSERT_TRUE(ref.count("grad." + name)) << where << ": eager PyTorch has no parameter " << name;
        ASSERT_TRUE(p.grad().defined()) << where << ": no gradient for " << name;
        EXPECT_LE((p.grad() - ref.at("grad." + name)).abs().max().item<double>(), 1e-10) << where << ": " << name;
      }
    }
    sgd.step();
  }
  auto state = model_named_parameters(*pipe);
  for (auto& b : model_named_buffers(*pipe)) state.push_back(b);
  size_t expected = 0;
  for (const auto& [key, t] : ref) expected += key.rfind("step3.", 0) == 0;
  EXPECT_EQ(state.size(), expected) << where << ": every parameter and buffer of the model, once";
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(ref.count("step3." + name)) << where << ": eager PyTorch has no " << name;
    const at::Tensor want = ref.at("step3." + name);
    EXPECT_LE((t.to(want.scalar_type()) - want).abs().max().item<double>(), 1e-10) << where << ": " << name
                                                                                   << " after 3 steps";
  }
}

class ExportedModels : public ::testing::TestWithParam<std::string> {};

TEST_P(ExportedModels, TrainLikeEagerPyTorchUnderGpipeAnd1f1bAtTwoToFourStages) {
  REQUIRE_EXPORT_FIXTURES();
  for (const Case& c : cases()) {
    if (c.model != GetParam()) continue;
    for (const auto& split : c.splits) {
      for (const std::string schedule : {"gpipe", "1f1b"}) check_against_eager(c, split, schedule);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ExportedModels,
                         ::testing::Values("mlp", "lstm_lm", "resblock", "transformer", "seq2seq"));

TEST(ExportedProgram, WithoutSplitPointsEachCalledModuleIsALayer) {
  REQUIRE_EXPORT_FIXTURES();
  const auto layers = sequential_from_export(load_exported(fixture("seq2seq.pt2")));
  std::vector<std::string> names;
  for (const auto& item : layers->named_children()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"src_embed", "encoder", "tgt_embed", "decoder", "attend", "combine",
                                             "out"}));
  // Balanced by parameters over 3 workers, the step is eager PyTorch's.
  const auto ref = reference("seq2seq");
  auto pipe = std::make_unique<Pipeline>(layers, PipelineOptions().workers(3).microbatches(4).schedule("1f1b"));
  const StepResult r = pipe->train_step(numbered(ref, "input."), numbered(ref, "target."), loss_of(true));
  EXPECT_NEAR(r.loss, ref.at("loss").item<double>(), 1e-10);
  for (const auto& [name, p] : model_named_parameters(*pipe)) {
    EXPECT_LE((p.grad() - ref.at("grad." + name)).abs().max().item<double>(), 1e-10) << name;
  }
}

TEST(ExportedProgram, EvaluationModeLeavesBatchNormStatisticsAlone) {
  REQUIRE_EXPORT_FIXTURES();
  const auto ref = reference("resblock");
  auto pipe = make_export_pipeline(load_exported(fixture("resblock.pt2")), PipelineOptions().microbatches(2),
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
  const auto ref = reference("mlp");
  auto pipe = make_export_pipeline(load_exported(fixture("static_batch.pt2")), PipelineOptions().microbatches(4),
                                   {"head"});
  EXPECT_THAT(error_of([&] { pipe->train_step(numbered(ref, "input."), numbered(ref, "target."), loss_of(false)); }),
              AllOf(HasSubstr("exported with size 8 in dimension 0, got 3"), HasSubstr("dynamic")));
}

}  // namespace
}  // namespace conveyor
