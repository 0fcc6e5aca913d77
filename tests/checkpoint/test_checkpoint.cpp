// Checkpoints: a resumed run takes bit for bit the steps an uninterrupted one
// takes, the file reads back as a dict of named tensors, and a checkpoint of
// another model or stage count is refused before anything changes.
#include "built_pipeline.h"
#include "error_of.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/script/torchscript.h"

#include "script_fixtures.h"
#include "test_models.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Per process: ctest runs the tests of this file side by side.
std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("conveyor_" + std::to_string(::getpid()) + "_" + name)).string();
}

// Dropout sits in stage 0 only: with one stage drawing random numbers the
// order of draws is fixed, so the run is reproducible at all.
torch::nn::Sequential dropout_mlp() {
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Dropout(0.3), torch::nn::Tanh(),
                          torch::nn::Linear(16, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  m->to(torch::kFloat64);
  return m;
}

PipelineOptions options(int stages = 2) { return PipelineOptions().workers(stages).microbatches(4).schedule("1f1b"); }

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

std::unique_ptr<torch::optim::Optimizer> sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

std::unique_ptr<torch::optim::Optimizer> adam(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

// Each step draws its batch from the global generator, as a data loader would.
void train(StageRunner& pipe, torch::optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = torch::randn({12, 8}, torch::kFloat64);
    const at::Tensor y = torch::randn({12, 3}, torch::kFloat64);
    opt.zero_grad();
    pipe.train_step(x, y, testing::mse);
    opt.step();
  }
}

void expect_bit_identical(const StageRunner& a, const StageRunner& b, const std::string& where) {
  const auto pa = model_named_parameters(a);
  const auto pb = model_named_parameters(b);
  ASSERT_EQ(pa.size(), pb.size()) << where;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first) << where;
    EXPECT_TRUE(torch::equal(pa[i].second, pb[i].second))
        << where << ": " << pa[i].first << " differs by " << (pa[i].second - pb[i].second).abs().max().item<double>();
  }
}

// 6 steps in one go against 3 steps, a checkpoint, a fresh pipeline and
// optimizer (other initial weights, other generator state), a load and 3 steps.
void check_resume(const std::function<std::shared_ptr<StageRunner>()>& make_pipe, const MakeOptimizer& make_opt,
                  const std::string& where) {
  const std::string path = temp_path("resume.ckpt");
  torch::manual_seed(42);
  auto straight = make_pipe();
  auto straight_opt = make_opt(straight->parameters());
  train(*straight, *straight_opt, 6);

  torch::manual_seed(42);
  auto first = make_pipe();
  auto first_opt = make_opt(first->parameters());
  train(*first, *first_opt, 3);
  save_checkpoint(path, *first, {3, {first_opt.get()}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << where;

  torch::manual_seed(7);
  auto resumed = make_pipe();
  auto resumed_opt = make_opt(resumed->parameters());
  torch::randn({100});  // move the generator on: the checkpoint must bring it back
  EXPECT_EQ(load_checkpoint(path, *resumed, {resumed_opt.get()}), 3) << where;
  train(*resumed, *resumed_opt, 3);
  expect_bit_identical(*straight, *resumed, where);
  std::filesystem::remove(path);
}

TEST(Checkpoint, ResumeIsBitIdenticalWithSgdMomentumAndAdam) {
  const auto make_pipe = [] { return std::make_shared<StageRunner>(dropout_mlp(), options().boundaries({3})); };
  check_resume(make_pipe, sgd, "sgd");
  check_resume(make_pipe, adam, "adam");
}

TEST(Checkpoint, ResumeIsBitIdenticalForATorchScriptModel) {
  REQUIRE_FIXTURES();
  const std::string file = testing::fixture("dropout_mlp.pt");
  const auto make_pipe = [&] { return testing::built_pipeline(load_script(file), options()); };
  check_resume(make_pipe, adam, "script adam");
}

using testing::invalid_argument_of;

// Dropout in both stages: reproducible only with each stage's own streams.
torch::nn::Sequential two_dropout_mlp() {
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Dropout(0.3), torch::nn::Tanh(),
                          torch::nn::Linear(16, 16), torch::nn::Dropout(0.5), torch::nn::ReLU(),
                          torch::nn::Linear(16, 3));
  m->to(torch::kFloat64);
  return m;
}

TEST(Checkpoint, StageRngResumesBitIdenticalWithDropoutInEveryStage) {
  const auto make_pipe = [] {
    return std::make_unique<StageRunner>(two_dropout_mlp(), options().boundaries({3}).stage_rng(true));
  };
  check_resume(make_pipe, sgd, "stage_rng sgd");
  check_resume(make_pipe, adam, "stage_rng adam");
}

// Keeps the pattern of zeros its input had, micro-batch by micro-batch.
struct ZeroPatternImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    patterns.push_back(x.detach() == 0);
    return x;
  }
  std::vector<at::Tensor> patterns;
};
TORCH_MODULE(ZeroPattern);

// With its own streams, stage 1's dropout masks do not depend on whether
// stage 0 draws random numbers at all.
std::vector<at::Tensor> stage1_masks(double stage0_dropout) {
  ZeroPattern seen;
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Dropout(stage0_dropout), torch::nn::Tanh(),
                          torch::nn::Linear(16, 16), torch::nn::Dropout(0.5), seen, torch::nn::Linear(16, 3));
  m->to(torch::kFloat64);
  torch::manual_seed(11);
  StageRunner pipe(m, options().boundaries({3}).stage_rng(true));
  const at::Tensor x = torch::randn({12, 8}, torch::kFloat64);
  const at::Tensor y = torch::randn({12, 3}, torch::kFloat64);
  pipe.train_step(x, y, testing::mse);
  return seen->patterns;
}

TEST(Checkpoint, StageRngGivesEachStageItsOwnStream) {
  const auto with = stage1_masks(0.5);
  const auto without = stage1_masks(0.0);
  ASSERT_EQ(with.size(), 4u);
  ASSERT_EQ(without.size(), 4u);
  int64_t zeros = 0;
  for (size_t mb = 0; mb < with.size(); ++mb) {
    EXPECT_TRUE(torch::equal(with[mb], without[mb])) << "micro-batch " << mb;
    zeros += with[mb].sum().item<int64_t>();
  }
  EXPECT_GT(zeros, 0);  // the dropout did drop
}

TEST(Checkpoint, StageRngMustBeOnBothSides) {
  const std::string path = temp_path("rng.ckpt");
  StageRunner with(testing::make_mlp(), options(2).stage_rng(true));
  save_checkpoint(path, with);
  StageRunner without(testing::make_mlp(), options(2));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, without); }),
              AllOf(HasSubstr("holds random streams of stage 0"), HasSubstr("without PipelineOptions::stage_rng")));
  std::filesystem::remove(path);
}

// Asynchronous schedules: the stages own their optimizers, update after every
// micro-batch and read a learning rate that decays with their update count;
// all of that must come back.
void train_own(StageRunner& pipe, int steps) {
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = torch::randn({12, 8}, torch::kFloat64);
    const at::Tensor y = torch::randn({12, 3}, torch::kFloat64);
    pipe.train_step(x, y, testing::mse);
  }
}

void check_async_resume(const std::string& schedule, const MakeOptimizer& make_opt, bool stage_rng = false) {
  const std::string path = temp_path("async.ckpt");
  const auto make_pipe = [&] {
    return std::make_unique<StageRunner>(
        dropout_mlp(), PipelineOptions()
                           .workers(3)
                           .boundaries({3, 5})
                           .microbatches(4)
                           .schedule(schedule)
                           .optimizer(make_opt)
                           .lr_schedule([](int64_t update) { return 0.05 / (1.0 + 0.1 * static_cast<double>(update)); })
                           .lr_schedule_unit(UpdateUnit::kMicrobatch)
                           .stage_rng(stage_rng));
  };
  torch::manual_seed(42);
  auto straight = make_pipe();
  train_own(*straight, 6);

  torch::manual_seed(42);
  auto first = make_pipe();
  train_own(*first, 3);
  save_checkpoint(path, *first, {3, {}});

  torch::manual_seed(7);
  auto resumed = make_pipe();
  torch::randn({100});
  EXPECT_EQ(load_checkpoint(path, *resumed), 3) << schedule;
  EXPECT_EQ(resumed->completed_steps(), 3) << schedule;
  for (int k = 0; k < 3; ++k) EXPECT_EQ(resumed->stage(k).updates(), first->stage(k).updates()) << schedule;
  train_own(*resumed, 3);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(resumed->stage(k).updates(), straight->stage(k).updates()) << schedule;
  expect_bit_identical(*straight, *resumed, schedule);
  std::filesystem::remove(path);
}

TEST(Checkpoint, AsynchronousSchedulesResumeBitIdenticalWithTheStagesOwnOptimizers) {
  check_async_resume("pipedream", sgd);  // weight stashing: the optimizers hold separate live weights
  check_async_resume("ddg", adam);
  check_async_resume("fr", sgd);
  check_async_resume("fr", sgd, /*stage_rng=*/true);  // features replay replays a forward's draws
}

TEST(Checkpoint, StageOptimizersMustBeOnBothSides) {
  torch::manual_seed(3);
  const std::string path = temp_path("own.ckpt");
  StageRunner owning(testing::make_mlp(), options(2).schedule("pipedream").optimizer(sgd));
  train_own(owning, 1);
  save_checkpoint(path, owning);
  StageRunner plain(testing::make_mlp(), options(2));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, plain); }),
              AllOf(HasSubstr("holds state of stage 0's own optimizer"), HasSubstr("this pipeline has no such")));
  StageRunner other_type(testing::make_mlp(), options(2).schedule("pipedream").optimizer(adam));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, other_type); }),
              HasSubstr("stage 0's optimizer: the saved state is of SGD, this optimizer is Adam"));
  StageRunner same(testing::make_mlp(), options(2).schedule("pipedream").optimizer(sgd));
  EXPECT_EQ(load_checkpoint(path, same), 0);
  expect_bit_identical(owning, same, "own");
  std::filesystem::remove(path);
}

TEST(Checkpoint, TheFileIsADictOfNamedTensorsAndState) {
  torch::manual_seed(1);
  StageRunner pipe(testing::make_mlp(), options(3));
  auto opt = sgd(pipe.parameters());
  train(pipe, *opt, 1);
  const std::string path = temp_path("contents.ckpt");
  save_checkpoint(path, pipe, {11, {opt.get()}});
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto d = torch::pickle_load(bytes).toGenericDict();
  EXPECT_EQ(d.at("format").toStringRef(), "conveyor-checkpoint");
  EXPECT_EQ(d.at("step").toInt(), 11);
  EXPECT_EQ(d.at("num_stages").toInt(), 3);
  EXPECT_EQ(d.at("schedule").toStringRef(), pipe.schedule().str());
  EXPECT_EQ(d.at("options").toGenericDict().at("microbatches").toInt(), 4);
  const auto model = d.at("model").toGenericDict();
  for (const auto& [name, p] : pipe.named_parameters()) {
    ASSERT_TRUE(model.contains(name)) << name;
    EXPECT_TRUE(torch::equal(model.at(name).toTensor(), p)) << name;
  }
  const auto stages = d.at("stages").toList();
  ASSERT_EQ(stages.size(), 3u);
  EXPECT_EQ(stages.get(1).toGenericDict().at("parameters").toList().get(0).toStringRef(), "4.weight");  // layers 3, 4
  const auto saved_opt = d.at("optimizers").toList().get(0).toGenericDict();
  EXPECT_EQ(saved_opt.at("type").toStringRef(), "SGD");
  EXPECT_EQ(saved_opt.at("stage").toInt(), -1);
  const at::Tensor p0 = pipe.parameters()[0];
  const auto& buffer = static_cast<torch::optim::SGDParamState&>(*opt->state().at(p0.unsafeGetTensorImpl()));
  EXPECT_TRUE(torch::equal(
      saved_opt.at("state").toGenericDict().at("0.weight").toGenericDict().at("momentum_buffer").toTensor(),
      buffer.momentum_buffer()));
  EXPECT_TRUE(d.at("rng").toGenericDict().at("cpu").toTensor().defined());
  std::filesystem::remove(path);
}

TEST(Checkpoint, RefusesAnotherModelOrStageCountAndChangesNothing) {
  torch::manual_seed(2);
  const std::string path = temp_path("refuse.ckpt");
  StageRunner saved(testing::make_mlp(), options(2));
  auto saved_opt = sgd(saved.parameters());
  train(saved, *saved_opt, 1);
  save_checkpoint(path, saved, {1, {saved_opt.get()}});

  torch::nn::Sequential wider(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  wider->to(torch::kFloat64);
  StageRunner other(wider, options(2));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, other); }),
              AllOf(HasSubstr(path), HasSubstr("different model"),
                    HasSubstr("'0.weight' has shape [16, 8] there and [32, 8] here")));
  StageRunner shorter(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh()), options(2));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, shorter); }),
              AllOf(HasSubstr("different model"), HasSubstr("no '")));

  // At another stage count (resharding), the caller's optimizers must still match.
  StageRunner three(testing::make_mlp(), options(3));
  const at::Tensor before = three.parameters()[0].clone();
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, three); }), HasSubstr("holds 1 optimizer states, but 0"));

  StageRunner same(testing::make_mlp(), options(2));
  auto adam_opt = adam(same.parameters());
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, same, {adam_opt.get()}); }),
              HasSubstr("optimizer 0: the saved state is of SGD, this optimizer is Adam"));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(path, same); }), HasSubstr("holds 1 optimizer states, but 0"));
  EXPECT_TRUE(torch::equal(three.parameters()[0], before));
  EXPECT_FALSE(torch::equal(same.parameters()[0], saved.parameters()[0]));  // untouched by the refused loads

  const std::string junk = temp_path("junk.ckpt");
  std::ofstream(junk) << "not a checkpoint";
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(junk, same); }), HasSubstr("is not a readable checkpoint"));
  std::filesystem::remove(junk);
  std::filesystem::remove(path);
}

// A file damaged inside (a value of the wrong type or shape, a random state
// that does not fit, a truncated file) is refused with
// std::invalid_argument, naming the entry, before anything changes: the
// random state used to be set, and fail, after the weights were written.
TEST(Checkpoint, RefusesADamagedFileAndChangesNothing) {
  torch::manual_seed(3);
  const std::string path = temp_path("damaged.ckpt");
  StageRunner saved(testing::make_mlp(), options(2));
  auto saved_opt = adam(saved.parameters());
  train(saved, *saved_opt, 1);
  save_checkpoint(path, saved, {1, {saved_opt.get()}});
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string copy = temp_path("damaged-copy.ckpt");
  const auto damaged = [&](const std::function<void(c10::impl::GenericDict&)>& change) {
    auto d = torch::pickle_load(bytes).toGenericDict();
    change(d);
    // With a digest of the changed content: what a writer's bug would leave.
    const std::vector<char> out = checkpoint_bytes(d);
    std::ofstream(copy, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
    return copy;
  };
  StageRunner pipe(testing::make_mlp(), options(2));
  auto opt = adam(pipe.parameters());
  const at::Tensor before = pipe.parameters()[0].clone();
  const auto refused = [&](const std::string& file) {
    return invalid_argument_of([&] { load_checkpoint(file, pipe, {opt.get()}); });
  };
  EXPECT_THAT(refused(damaged([](auto& d) {
                d.at("rng").toGenericDict().insert_or_assign("cpu", torch::zeros({3}, torch::kUInt8));
              })),
              AllOf(HasSubstr("is damaged"), HasSubstr("rng 'cpu' has 3 elements, a cpu random generator's state")));
  EXPECT_THAT(refused(damaged([](auto& d) { d.insert_or_assign("num_stages", "two"); })),
              HasSubstr("'num_stages' is a String, not an integer"));
  EXPECT_THAT(refused(damaged([](auto& d) {
                auto state = d.at("optimizers").toList().get(0).toGenericDict().at("state").toGenericDict();
                state.at("0.weight").toGenericDict().insert_or_assign("exp_avg", torch::zeros({2}));
              })),
              HasSubstr("'0.weight': 'exp_avg' has shape [2], its parameter [16, 8]"));
  EXPECT_THAT(refused(damaged([](auto& d) { d.at("model").toGenericDict().insert_or_assign("0.weight", 3.5); })),
              HasSubstr("model '0.weight' is a Double, not a tensor"));
  // A truncated file: LibTorch's own reader of a file's bytes read past their end.
  std::ofstream(copy, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  EXPECT_THAT(refused(copy), HasSubstr("is not a readable checkpoint"));
  EXPECT_TRUE(torch::equal(pipe.parameters()[0], before));
  EXPECT_TRUE(opt->state().empty());
  std::filesystem::remove(copy);
  std::filesystem::remove(path);
}

TEST(Checkpoint, SavingReplacesTheFileAtomically) {
  const std::string path = temp_path("atomic.ckpt");
  std::ofstream(path) << "previous";
  StageRunner pipe(testing::make_mlp(), options(2));
  save_checkpoint(path, pipe, {5, {}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  StageRunner fresh(testing::make_mlp(), options(2));
  EXPECT_EQ(load_checkpoint(path, fresh), 5);
  expect_bit_identical(pipe, fresh, "atomic");
  EXPECT_THROW(save_checkpoint("/nonexistent-dir/x.ckpt", pipe), std::runtime_error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace conveyor
