// A checkpoint's optimizer values that pass every check of their kind but
// that the restored optimizer could not step with (found by the checkpoint
// fuzzer): refused when loaded, naming the value, and nothing changes. And
// the record of the options a checkpoint keeps.
#include "error_of.h"
#include "plugin/core/option_values.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/checkpoint_file.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

std::string values_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("conveyor_values_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A float32 model: an lr of 1e39 fits a double but no float parameter.
torch::nn::Sequential float_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
}

TEST(CheckpointValues, AnLrOrStepTheOptimizerCannotStepWithIsRefused) {
  torch::manual_seed(0);
  const auto options = PipelineOptions().workers(2).microbatches(2);
  const auto mse = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
  StageRunner saved(float_mlp(), options);
  torch::optim::Adam saved_opt(saved.parameters(), 1e-2);
  saved.train_step(torch::randn({4, 4}), torch::randn({4, 2}), mse);
  saved_opt.step();
  const std::string path = values_path("saved.ckpt"), copy = values_path("changed.ckpt");
  save_checkpoint(path, saved, {1, {&saved_opt}});
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  StageRunner pipe(float_mlp(), options);
  torch::optim::Adam opt(pipe.parameters(), 1e-2);
  const at::Tensor before = pipe.parameters()[0].clone();
  // What loading says of the checkpoint with `key` of its optimizer's param group 0 (`in_state`: of the
  // state of '0.weight') set to `value`.
  const auto loaded_with = [&](bool in_state, const char* key, const c10::IValue& value) {
    auto d = torch::pickle_load(bytes).toGenericDict();
    auto saved_opt_state = d.at("optimizers").toList().get(0).toGenericDict();
    auto where = in_state ? saved_opt_state.at("state").toGenericDict().at("0.weight")
                          : saved_opt_state.at("param_groups").toList().get(0);
    where.toGenericDict().insert_or_assign(key, value);
    const std::vector<char> out = checkpoint_bytes(d);  // with the digest of the changed content
    std::ofstream(copy, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
    return invalid_argument_of([&] { load_checkpoint(copy, pipe, {&opt}); });
  };
  EXPECT_THAT(loaded_with(false, "lr", -0.5), HasSubstr("'lr' is -0.5, not a finite rate of 0 or more"));
  EXPECT_THAT(loaded_with(false, "lr", std::nan("")), HasSubstr("not a finite rate of 0 or more"));
  // Adam's first step scales by lr / (1 - beta1) = 1e40 (10 * 1e39): past a float's range.
  EXPECT_THAT(loaded_with(false, "lr", 1e39),
              HasSubstr("'lr' is 1e+39: its optimizer's step would scale by 1e+40, more than a Float parameter holds"));
  EXPECT_THAT(loaded_with(true, "step", std::numeric_limits<int64_t>::max()),
              HasSubstr("'0.weight': 'step' is 9223372036854775807, past 2^53"));
  EXPECT_TRUE(torch::equal(pipe.parameters()[0], before));
  EXPECT_TRUE(opt.state().empty());
  // The largest rate a float parameter's Adam step can take still loads, and steps.
  EXPECT_EQ(loaded_with(false, "lr", 1e37), "(no exception thrown)");
  pipe.train_step(torch::randn({4, 4}), torch::randn({4, 2}), mse);
  EXPECT_NO_THROW(opt.step());
  std::filesystem::remove(copy);
  std::filesystem::remove(path);
}

TEST(CheckpointValues, TheFileRecordsEveryOptionPythonCanGiveAsPythonSpellsIt) {
  const auto options = PipelineOptions().workers(2).microbatches(2).loss_reduction(LossReduction::kSum).timeout(
      std::chrono::seconds(30));
  StageRunner pipe(float_mlp(), options);
  const std::string path = values_path("options.ckpt");
  save_checkpoint(path, pipe);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto saved = torch::pickle_load(bytes).toGenericDict().at("options").toGenericDict();
  std::vector<OptionDescription> rows;
  describe_options(options, rows);
  size_t python = 0;
  for (const OptionDescription& row : rows) {
    if (row.type.empty()) {
      EXPECT_FALSE(saved.contains(row.name)) << row.name << " is C++ only";
      continue;
    }
    ++python;
    ASSERT_TRUE(saved.contains(row.name)) << row.name;
    EXPECT_EQ(python_repr(saved.at(row.name)), python_repr(row.default_value)) << row.name;
  }
  EXPECT_EQ(saved.size(), python);
  EXPECT_EQ(saved.at("loss_reduction").toStringRef(), "sum");
  EXPECT_EQ(saved.at("timeout").toDouble(), 30.0);
  EXPECT_EQ(saved.at("microbatches").toInt(), 2);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace conveyor
