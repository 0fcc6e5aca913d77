// Optimizer state, and with it the gradients and the parameters, sharded
// across replicas (ZeRO-1, 2 and 3) over c10d: D = 2 replicas of a K = 2
// worker pipeline (4 processes, float64) train each case at each level and
// unsharded (distributed/sharded_roles.h); the weights must agree, each
// replica must hold half of the optimizer's state (and, at ZeRO-2 and 3, of
// the gradients at the update; at ZeRO-3, of the weights between steps), and
// what cannot be sharded is refused.

#include "distributed/sharded_roles.h"
#include "distributed/training_options_check.h"
#include "rank_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::vector<std::string> kReported = {"losses",      "norms",          "scales",
                                            "skipped",     "state_bytes",    "gradient_bytes",
                                            "resident_weight_bytes"};
const std::vector<std::string> kSharded = {"sharded", "gradients", "parameters"};

class ShardedOptimizerState : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = (fs::temp_directory_path() / ("conveyor-sharded-" + std::to_string(::getpid()))).string();
    exits_ = launch("sharded", 4, out_);
  }
  static void TearDownTestSuite() { fs::remove_all(out_); }

  static void expect_success() {
    std::ostringstream logs;
    for (size_t r = 0; r < exits_.size(); ++r) logs << "--- rank " << r << "\n" << exits_[r].log;
    for (const auto& e : exits_) ASSERT_EQ(e.code, 0) << logs.str();
  }
  static TensorMap result(const std::string& name, const std::string& variant, int rank) {
    return read_tensors(out_ + "/" + name + "-" + variant + "-rank" + std::to_string(rank) + ".pt");
  }
  static TensorMap weights(TensorMap all) {
    for (const auto& key : kReported) all.erase(key);
    return all;
  }
  // Sharded (each of `variants`) against unsharded on every rank: weights and
  // everything reported within 1e-12; with `bit_identical`, every weight bit
  // for bit.
  static void expect_same_training(const std::string& name, bool bit_identical,
                                   const std::vector<std::string>& variants = kSharded) {
    for (const std::string& variant : variants) expect_same_training(name, variant, bit_identical);
  }
  static void expect_same_training(const std::string& name, const std::string& variant, bool bit_identical) {
    expect_success();
    for (int rank = 0; rank < 4; ++rank) {
      const TensorMap plain = result(name, "plain", rank), sharded = result(name, variant, rank);
      const std::string where = name + " " + variant + " rank " + std::to_string(rank);
      ASSERT_EQ(weights(plain).size(), weights(sharded).size()) << where;
      for (const auto& [key, want] : weights(plain)) {
        const at::Tensor& got = sharded.at(key);
        EXPECT_LE((got - want).abs().max().item<double>(), 1e-12) << where << ": " << key;
        if (bit_identical) {
          EXPECT_TRUE(torch::equal(got, want)) << where << ": " << key << " not bit-identical";
        }
      }
      for (const auto& key : {"losses", "norms", "scales", "skipped"}) {
        EXPECT_TRUE(torch::allclose(sharded.at(key), plain.at(key), 0, 1e-12, /*equal_nan=*/true))
            << where << ": " << key;
      }
    }
  }
  // Each replica keeps `fields` state tensors of ceil(n / 2) elements per
  // weight of n: half of the unsharded state (padding aside).
  static void expect_half_the_state(const std::string& name, int fields) {
    expect_success();
    for (int rank = 0; rank < 4; ++rank) {
      const TensorMap plain = result(name, "plain", rank);
      int64_t whole = 0, half = 0;
      for (const auto& [key, w] : weights(plain)) {
        whole += fields * w.numel() * 8;
        half += fields * ((w.numel() + 1) / 2) * 8;
      }
      const std::string where = name + " rank " + std::to_string(rank);
      EXPECT_EQ(plain.at("state_bytes").item<double>(), static_cast<double>(whole)) << where;
      for (const std::string& variant : kSharded) {
        EXPECT_EQ(result(name, variant, rank).at("state_bytes").item<double>(), static_cast<double>(half))
            << where << " " << variant;
      }
      EXPECT_LE(2 * half, whole + fields * 8 * static_cast<int64_t>(weights(plain).size())) << where;
    }
  }

  static inline std::string out_;
  static inline std::vector<RankExit> exits_;
};

TEST_F(ShardedOptimizerState, AdamWithALearningRateScheduleUpdatesAsUnsharded) {
  expect_same_training("adam-1f1b", true);
  expect_half_the_state("adam-1f1b", 2);
}

// At ZeRO-2 and 3 the update finds only this replica's pieces of the reduced
// gradients (ceil(n / 2) of each weight of n), the whole ones released; at
// ZeRO-1 and unsharded, whole gradients. Between steps, ZeRO-3 keeps only the
// pieces of the weights; the other levels, the whole weights.
TEST_F(ShardedOptimizerState, ShardedGradientsKeepHalfTheGradientStorage) {
  expect_success();
  for (int rank = 0; rank < 4; ++rank) {
    const TensorMap plain = result("adam-1f1b", "plain", rank);
    double whole = 0, half = 0;
    for (const auto& [key, w] : weights(plain)) {
      whole += static_cast<double>(w.numel() * 8);
      half += static_cast<double>((w.numel() + 1) / 2 * 8);
    }
    const std::string where = "rank " + std::to_string(rank);
    EXPECT_EQ(plain.at("gradient_bytes").item<double>(), whole) << where;
    EXPECT_EQ(result("adam-1f1b", "sharded", rank).at("gradient_bytes").item<double>(), whole) << where;
    EXPECT_EQ(result("adam-1f1b", "gradients", rank).at("gradient_bytes").item<double>(), half) << where;
    EXPECT_EQ(result("adam-1f1b", "parameters", rank).at("gradient_bytes").item<double>(), half) << where;
    for (const char* variant : {"plain", "sharded", "gradients"}) {
      EXPECT_EQ(result("adam-1f1b", variant, rank).at("resident_weight_bytes").item<double>(), whole)
          << where << " " << variant;
    }
    EXPECT_EQ(result("adam-1f1b", "parameters", rank).at("resident_weight_bytes").item<double>(), half) << where;
  }
}

// A frozen weight stays as it was; two steps' gradients reduced at once.
TEST_F(ShardedOptimizerState, AFrozenWeightAndAccumulatedStepsUpdateAsUnsharded) {
  expect_same_training("frozen-accumulated", true);
  const TensorMap plain = result("frozen-accumulated", "plain", 0);
  EXPECT_TRUE(torch::equal(plain.at("0.bias"), values_of(seeded_mlp()).at("0.bias")));
  EXPECT_FALSE(torch::equal(plain.at("0.weight"), values_of(seeded_mlp()).at("0.weight")));
}

// A reduce-scatter after every backward, each replica adding up its pieces:
// the sums in another order than one reduction a step. At ZeRO-3 the weights
// are also gathered for each forward and backward and released after it, so
// that every backward runs on weights refilled since its forward.
TEST_F(ShardedOptimizerState, ShardedGradientsReducedPerMicroBatchUpdateAsUnsharded) {
  expect_same_training("adam-per-microbatch", "gradients", false);
  expect_same_training("adam-per-microbatch", "parameters", false);
}

TEST_F(ShardedOptimizerState, SgdWithMomentumAndAScaledLearningRateUpdatesAsUnsharded) {
  expect_same_training("sgd-gpipe", true);
  expect_half_the_state("sgd-gpipe", 1);
}

TEST_F(ShardedOptimizerState, AdamWUnderAnInterleavedScheduleUpdatesAsUnsharded) {
  expect_same_training("adamw-interleaved", true);
  expect_half_the_state("adamw-interleaved", 2);
}

// The V shape's worker holds two stages, each reduce-scattered at its place.
TEST_F(ShardedOptimizerState, AdamUnderZeroBubbleSchedulesUpdatesAsUnsharded) {
  for (const char* name : {"adam-zb-h1", "adam-zb-v"}) {
    expect_same_training(name, true);
    expect_half_the_state(name, 2);
  }
}

// The clipping norm sums the replicas' shards (not bit-identical: another
// order of the sum); the overflow on rank 0 skips the step on every rank.
TEST_F(ShardedOptimizerState, ClippingAndAnOverflowOnOneRankActAsUnsharded) {
  expect_same_training("clip-scale", false);
  for (int rank = 0; rank < 4; ++rank) {
    const TensorMap sharded = result("clip-scale", "sharded", rank);
    EXPECT_EQ(sharded.at("skipped")[kOverflowStep].item<double>(), 1) << "rank " << rank;
    EXPECT_EQ(sharded.at("skipped").sum().item<double>(), 1) << "rank " << rank;
    EXPECT_LT(sharded.at("norms")[0].item<double>(), 1e3) << "rank " << rank;
  }
}

TEST_F(ShardedOptimizerState, TiedWeightsStayBitIdenticalAcrossStagesAndReplicas) {
  expect_same_training("tied", true);
  const at::Tensor embedding = result("tied", "sharded", 0).at("0.weight");
  for (int rank = 0; rank < 4; ++rank) {
    const TensorMap got = result("tied", "sharded", rank);
    const std::string key = rank % 2 == 0 ? "0.weight" : "2.weight";
    EXPECT_TRUE(torch::equal(got.at(key), embedding)) << "rank " << rank << ": " << key;
  }
}

// The checkpoint holds the whole state: saved at ZeRO-1 or ZeRO-3, a
// pipeline sharded at any level and an unsharded one resume from it into the
// uninterrupted run's next steps.
TEST_F(ShardedOptimizerState, ACheckpointResumesShardedOrNotAsIfNeverStopped) {
  expect_success();
  for (int rank = 0; rank < 4; ++rank) {
    const auto file = [&](const std::string& what) {
      return read_tensors(out_ + "/" + what + "-rank" + std::to_string(rank) + ".pt");
    };
    for (const std::string from : {"sharded", "parameters"}) {
      const TensorMap want = file(from + "-resume-uninterrupted");
      for (const char* to : {"sharded", "gradients", "parameters", "plain"}) {
        const TensorMap got = file(from + "-resume-" + to);
        ASSERT_EQ(got.size(), want.size());
        for (const auto& [key, t] : want) {
          EXPECT_TRUE(torch::equal(got.at(key), t)) << from << " to " << to << " rank " << rank << ": " << key;
        }
      }
    }
  }
}

TEST_F(ShardedOptimizerState, WhatCannotBeShardedIsRefusedByName) {
  expect_success();
  std::ifstream in(out_ + "/sharded-refusals-rank0.txt");
  std::string pipedream, lbfgs, none, per_microbatch;
  std::getline(in, pipedream);
  std::getline(in, lbfgs);
  std::getline(in, none);
  std::getline(in, per_microbatch);
  EXPECT_THAT(pipedream, HasSubstr("needs a synchronous schedule; 'pipedream'"));
  EXPECT_THAT(lbfgs, HasSubstr("elementwise"));
  EXPECT_THAT(lbfgs, HasSubstr("LBFGS"));
  EXPECT_THAT(none, HasSubstr("needs the pipeline's own optimizer"));
  EXPECT_THAT(per_microbatch, HasSubstr("has 0REDUCE_GRAD on worker 0, which a pipeline does not run: it reduces a "
                                        "stage's gradients once a step"));
}

}  // namespace
}  // namespace conveyor::testing
