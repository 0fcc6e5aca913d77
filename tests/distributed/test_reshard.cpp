// Checkpoints that reshard across processes: K = 2 stages x D = 2 replicas
// over c10d (4 processes, float64, Adam with a learning-rate schedule), the
// optimizer state sharded across the replicas or not, save every rank's file
// at step 3 and step 6 (distributed/reshard_roles.h). K = 3 x D = 1 (3
// processes) and K = 1 (in this process) resume from the step-3 files and
// take steps 3 to 5: the weights and the optimizer state must equal the
// uninterrupted run's. The plain state dict of the files loads into the
// unsplit model and gives the pipeline's loss; missing and foreign files are
// refused by name.

#include "distributed/reshard_roles.h"
#include "error_of.h"
#include "plugin/checkpoint/model_state.h"
#include "rank_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <filesystem>
#include <sstream>

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class ReshardingCheckpoints : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = (fs::temp_directory_path() / ("conveyor-reshard-" + std::to_string(::getpid()))).string();
    saved_ = launch("reshard", 4, out_);
    resumed_ = launch("reshard", 3, out_);
  }
  static void TearDownTestSuite() { fs::remove_all(out_); }

  static void expect_success() {
    for (const auto* job : {&saved_, &resumed_}) {
      std::ostringstream logs;
      for (size_t r = 0; r < job->size(); ++r) logs << "--- rank " << r << "\n" << (*job)[r].log;
      for (const auto& e : *job) ASSERT_EQ(e.code, 0) << logs.str();
    }
  }
  static std::vector<std::string> files(const std::string& what, int world) { return rank_files(out_, what, world); }

  // A one-stage pipeline of this process, as the reference reads a checkpoint into.
  static StageRunner one_stage() { return StageRunner(make_mlp(), reshard_options().workers(1)); }

  // Weights, Adam's moments and step counts, and the learning rate, by parameter name.
  static TensorMap state_of(const StageRunner& pipe) {
    TensorMap out;
    torch::optim::Optimizer* opt = pipe.stage(0).optimizer();
    for (const auto& [name, p] : pipe.named_parameters()) {
      out[name] = p.detach().clone();
      const auto& st = static_cast<const torch::optim::AdamParamState&>(*opt->state().at(p.unsafeGetTensorImpl()));
      out[name + " exp_avg"] = st.exp_avg();
      out[name + " exp_avg_sq"] = st.exp_avg_sq();
      out[name + " step"] = torch::tensor(static_cast<double>(st.step()), at::kDouble);
    }
    out["lr"] = torch::tensor(opt->param_groups()[0].options().get_lr(), at::kDouble);
    return out;
  }
  static TensorMap state_of_files(const std::vector<std::string>& paths) {
    StageRunner pipe = one_stage();
    EXPECT_EQ(load_checkpoint_files(paths, pipe), 6);
    return state_of(pipe);
  }
  static void expect_near(const TensorMap& got, const TensorMap& want, const std::string& where) {
    ASSERT_EQ(got.size(), want.size()) << where;
    for (const auto& [key, t] : want) {
      EXPECT_LE((got.at(key) - t).abs().max().item<double>(), 1e-12) << where << ": " << key;
    }
  }

  static std::string out_;
  static std::vector<RankExit> saved_, resumed_;
};

std::string ReshardingCheckpoints::out_;
std::vector<RankExit> ReshardingCheckpoints::saved_, ReshardingCheckpoints::resumed_;

TEST_F(ReshardingCheckpoints, TwoByTwoResumesAtThreeStagesOfOneReplicaAsIfNeverStopped) {
  expect_success();
  for (const bool sharded : {true, false}) {
    const std::string variant = reshard_variant(sharded);
    expect_near(state_of_files(files("k3-" + variant + "-step6", 3)), state_of_files(files(variant + "-step6", 4)),
                variant + " at K = 3 x D = 1");
  }
}

TEST_F(ReshardingCheckpoints, TwoByTwoResumesInOneProcessAtOneStageAsIfNeverStopped) {
  expect_success();
  for (const bool sharded : {true, false}) {
    const std::string variant = reshard_variant(sharded);
    StageRunner pipe = one_stage();
    ASSERT_EQ(load_checkpoint_files(files(variant + "-step3", 4), pipe), 3);
    for (int step = 3; step < 6; ++step) {
      const Data s = global_batch(step);
      pipe.train_step(s.x, s.y, mse);
    }
    expect_near(state_of(pipe), state_of_files(files(variant + "-step6", 4)), variant + " at K = 1");
  }
}

TEST_F(ReshardingCheckpoints, ThePlainStateDictLoadsIntoTheUnsplitModelWithThePipelinesLoss) {
  expect_success();
  const std::vector<std::string> step6 = files("sharded-step6", 4);
  StageRunner pipe = one_stage();
  load_checkpoint_files(step6, pipe);
  const Data probe = global_batch(99);
  const double want = mse(pipe.forward(probe.x), probe.y).item<double>();

  const std::string plain = out_ + "/plain.pt", archive = out_ + "/archive.pt";
  export_model_state(step6, plain);
  torch::manual_seed(5);  // other initial weights, all overwritten
  auto model = make_mlp();
  load_model_state(plain, *model);
  EXPECT_EQ(mse(model->forward(probe.x), probe.y).item<double>(), want);

  save_model_archive(archive, *model);
  torch::manual_seed(6);
  auto read_back = make_mlp();
  torch::load(read_back, archive);  // LibTorch's own reader
  EXPECT_EQ(mse(read_back->forward(probe.x), probe.y).item<double>(), want);

  torch::manual_seed(7);
  auto from_files = make_mlp();
  load_model_state_files(files("k3-sharded-step6", 3), *from_files);
  EXPECT_NEAR(mse(from_files->forward(probe.x), probe.y).item<double>(), want, 1e-12);
}

TEST_F(ReshardingCheckpoints, AMissingShardStageOrForeignFileIsRefusedByNameChangingNothing) {
  expect_success();
  StageRunner pipe = one_stage();
  const TensorMap before = values_of(pipe.named_parameters());
  const std::vector<std::string> sharded = files("sharded-step3", 4), plain = files("plain-step3", 4);
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint_files({sharded[0], sharded[1], sharded[2]}, pipe); }),
              HasSubstr("stage 1's optimizer state is split across 2 replicas, and none of the 3 checkpoint files "
                        "given holds replica 1's part: the file of stage 1's replica 1 is missing"));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint_files({plain[0], plain[2]}, pipe); }),
              HasSubstr("none of the 2 checkpoint files given holds stage 1 of 2: the file of a process that ran "
                        "stage 1 is missing"));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint(sharded[0], pipe); }),
              HasSubstr("together (load_checkpoint_files)"));
  const std::vector<std::string> step6 = files("sharded-step6", 4);
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint_files({sharded[0], step6[1], step6[2], step6[3]}, pipe); }),
              HasSubstr("at steps 3 and 6: they are not one checkpoint"));
  StageRunner other(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 5),
                                       torch::nn::ReLU(), torch::nn::Linear(5, 3)),
                 reshard_options().workers(1));
  EXPECT_THAT(invalid_argument_of([&] { load_checkpoint_files(sharded, other); }),
              HasSubstr("is of a different model: '2.weight' has shape [16, 16] there and [5, 16] here"));
  for (const auto& [name, t] : values_of(pipe.named_parameters())) {
    EXPECT_TRUE(torch::equal(t, before.at(name))) << name << " changed";
  }
}

}  // namespace
}  // namespace conveyor::testing
