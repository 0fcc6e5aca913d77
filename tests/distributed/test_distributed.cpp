// Multi-process pipelines over c10d (Gloo, loopback). The test binary starts
// copies of itself as the ranks of a job (see rank_launcher.h); each rank runs
// a role of distributed_roles.h and writes what it computed, and the tests
// compare that with the single-process runtime or plain single-process training.

#include "distributed_roles.h"
#include "distributed/faulty_peer_check.h"
#include "distributed/hybrid_roles.h"
#include "distributed/run_worker.h"
#include "distributed/training_options_check.h"
#include "error_of.h"
#include "plugin/measure/c10d_link.h"
#include "rank_launcher.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr double kTolerance = 1e-10;

std::string scratch(const std::string& name) {
  return (fs::temp_directory_path() / ("conveyor-dist-" + std::to_string(::getpid()) + "-" + name)).string();
}

// ---------------------------------------------------------------------------
// References and comparisons.

TensorMap merged(const std::string& out, const std::string& what, int world) {
  TensorMap all;
  for (int r = 0; r < world; ++r) {
    for (auto& [name, t] : read_tensors(out + "/" + what + "-rank" + std::to_string(r) + ".pt")) all[name] = t;
  }
  return all;
}

TensorMap in_process_grads(const std::string& schedule, int stages) {
  StageRunner pipe(seeded_mlp(), synchronous_case(schedule).workers(stages));
  const Data d = global_batch(0);
  const StepResult r = pipe.train_step(d.x, d.y, mse);
  TensorMap grads = grads_of(pipe.named_parameters());
  grads["loss"] = at::full({1}, r.loss, at::kDouble);
  return grads;
}

TensorMap in_process_pipedream(int stages) {
  StageRunner pipe(
      seeded_mlp(),
      PipelineOptions().workers(stages).microbatches(kMicrobatches).schedule("pipedream").optimizer(sgd_momentum()));
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    pipe.train_step(s.x, s.y, mse);
  }
  return values_of(pipe.named_parameters());
}

// Plain training on the global batch: what data parallelism must reproduce.
TensorMap single_process(const OptimizerFactory& make_optimizer, std::vector<double>* losses = nullptr) {
  auto model = seeded_mlp();
  const std::unique_ptr<torch::optim::Optimizer> optimizer = make_optimizer(model->parameters());
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    optimizer->zero_grad();
    const at::Tensor loss = mse(model->forward(s.x), s.y);
    loss.backward();
    optimizer->step();
    if (losses) losses->push_back(loss.item<double>());
  }
  return values_of(model);
}

TensorMap single_process_sgd(double lr, std::vector<double>* losses = nullptr) {
  return single_process([lr](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, lr); },
                        losses);
}


// ---------------------------------------------------------------------------
// The tests. Each suite launches its ranks once.

class Job : public ::testing::Test {
 protected:
  static void expect_success(const std::vector<RankExit>& exits) {
    for (const auto& e : exits) ASSERT_EQ(e.code, 0) << logs(exits);
  }
};

class TwoRanks : public Job {
 protected:
  static void SetUpTestSuite() {
    out_ = scratch("two");
    exits_ = launch("two", 2, out_);
  }
  static void TearDownTestSuite() { fs::remove_all(out_); }
  static inline std::string out_;
  static inline std::vector<RankExit> exits_;
};

TEST_F(TwoRanks, EveryRankSucceeds) { expect_success(exits_); }

TEST_F(TwoRanks, SynchronousGradientsEqualTheInProcessRuntime) {
  expect_success(exits_);
  for (const std::string& schedule : synchronous_cases()) {
    expect_equal(merged(out_, schedule, 2), in_process_grads(schedule, 2), schedule + " K=2");
  }
}

// Two chunks per process: stages 0 and 2 on rank 0, 1 and 3 on rank 1.
TEST_F(TwoRanks, InterleavedSchedulesWithTwoChunksPerProcessEqualTheInProcessRuntime) {
  expect_success(exits_);
  for (const std::string& schedule : virtual_stage_cases()) {
    const TensorMap got = merged(out_, schedule, 2);
    EXPECT_EQ(got.size(), 9u) << schedule;  // 4 linear layers' weights and biases, and the loss
    expect_equal(got, in_process_grads(schedule, 2), schedule + " K=2 v=2");
  }
}

TEST_F(TwoRanks, PipeDreamWeightsEqualTheInProcessRuntime) {
  expect_success(exits_);
  expect_equal(merged(out_, "pipedream", 2), in_process_pipedream(2), "pipedream K=2");
}

TEST_F(TwoRanks, EachRankCheckpointsItsStageAndResumesExactly) {
  expect_success(exits_);
  for (int r = 0; r < 2; ++r) {
    const std::string rank = "-rank" + std::to_string(r) + ".pt";
    const TensorMap next = read_tensors(out_ + "/pipedream-next" + rank);
    const TensorMap resumed = read_tensors(out_ + "/pipedream-resumed" + rank);
    ASSERT_FALSE(next.empty()) << "rank " << r;
    ASSERT_EQ(next.size(), resumed.size()) << "rank " << r;
    for (const auto& [name, t] : next) {
      ASSERT_EQ(resumed.count(name), 1u) << "rank " << r << ": " << name;
      EXPECT_TRUE(torch::equal(t, resumed.at(name))) << "rank " << r << ": " << name;
    }
    std::ifstream in(out_ + "/pipedream-ckpt" + rank, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto stages = torch::pickle_load(bytes).toGenericDict().at("stages").toList();
    EXPECT_TRUE(stages.get(r).toGenericDict().at("local").toBool()) << "rank " << r;
    EXPECT_FALSE(stages.get(1 - r).toGenericDict().at("local").toBool()) << "rank " << r;
  }
}

TEST_F(TwoRanks, AllReduceDataParallelEqualsSingleProcessTraining) {
  expect_success(exits_);
  const TensorMap want = single_process_sgd(0.1);
  for (int r = 0; r < 2; ++r) {
    expect_equal(read_tensors(out_ + "/ddp-rank" + std::to_string(r) + ".pt"), want, "ddp rank " + std::to_string(r));
  }
}

TEST_F(TwoRanks, ClippingByGlobalNormAndAnOverflowOnOneRankEqualOneProcess) { expect_training_options(out_, 2); }

TEST_F(TwoRanks, Bf16AutocastOverC10dEqualsTheInProcessPipelineBitForBit) { expect_bf16_as_in_process(out_); }

TEST_F(TwoRanks, AnActivationOfAnotherShapeThanDeclaredNamesBothStages) {
  expect_success(exits_);
  std::ifstream in(out_ + "/mismatch-rank1.txt");
  const std::string message((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(message, HasSubstr("stage 1 failed in 1F0"));
  EXPECT_THAT(message, HasSubstr("the activation of micro-batch 0 from rank 0 (stage 0) does not match what stage 1 "
                                 "expects: it is [4, 16] Double, but the declared shape is [-1, 7]"));
}

TEST_F(TwoRanks, SeveralTensorsCrossProcessesAsInProcess) {
  expect_success(exits_);
  const Data d = global_batch(0);
  StageRunner two(seeded_two_input(), PipelineOptions().workers(2).microbatches(kMicrobatches));
  two.train_step(two_input_batch(), Tensors{d.y}, mse_of_first);
  expect_equal(merged(out_, "two-input", 2), grads_of(two.named_parameters()), "two inputs K=2");

  // Micro-batches of lengths 3, 7, 2, 5 in one step, no shape declared.
  StageRunner bucketed(seeded_lstm_lm(), PipelineOptions().workers(2).microbatches(kMicrobatches));
  const auto [inputs, targets] = bucketed_batches();
  bucketed.train_microbatches(inputs, targets, lm_loss_of_first);
  expect_equal(merged(out_, "bucketed", 2), grads_of(bucketed.named_parameters()), "bucketed K=2");
}

// One message per micro-batch and boundary: the payload rides with its header
// while the whole fits 1 MiB, and follows on a tag of its own otherwise. Each
// rank sends kMicrobatches messages a step (activations one way, gradients the
// other) and the gradients stay those of the in-process runtime.
TEST_F(TwoRanks, EachMicrobatchCrossesABoundaryAsOneMessageUnlessItIsLarge) {
  expect_success(exits_);
  const Data d = global_batch(0);
  for (const int64_t width : {16, 70000}) {
    const std::string what = "wide" + std::to_string(width);
    const int per_message = width == 16 ? 1 : 2;
    for (int r = 0; r < 2; ++r) {
      std::ifstream in(out_ + "/" + what + "-rank" + std::to_string(r) + ".txt");
      int64_t messages = -1, wire = -1;
      in >> messages >> wire;
      EXPECT_EQ(messages, kMicrobatches) << what << " rank " << r;
      EXPECT_EQ(wire, per_message * kMicrobatches) << what << " rank " << r;
    }
    StageRunner pipe(seeded_wide(width), PipelineOptions().workers(2).microbatches(kMicrobatches));
    pipe.train_step(d.x, d.y, mse);
    expect_equal(merged(out_, what, 2), grads_of(pipe.named_parameters()), what);
  }
}

// Stage 0 releases the outputs it sent to the other process: its stash
// holds nothing (its inputs need no gradient) where it held its in-flight
// outputs, as the planner predicts for a link that copies; the last stage
// sends no activations and stashes the same; the gradients are the same bit
// for bit, and the in-process runtime's.
TEST_F(TwoRanks, SentOutputsAreReleasedAndTheGradientsStayTheSame) {
  expect_success(exits_);
  const auto file = [&](const std::string& what, int rank) {
    return read_tensors(out_ + "/" + what + "-rank" + std::to_string(rank) + ".pt");
  };
  const TensorMap released0 = file("released", 0), kept0 = file("kept", 0);
  const TensorMap released1 = file("released", 1), kept1 = file("kept", 1);
  const int64_t kept = kept0.at("peak_stash")[0].item<int64_t>();
  EXPECT_EQ(released0.at("peak_stash")[0].item<int64_t>(), 0);
  EXPECT_GT(kept, 0);
  EXPECT_TRUE(torch::equal(released1.at("peak_stash"), kept1.at("peak_stash")));
  for (const auto* pair : {&released0, &released1}) {
    const TensorMap& released = *pair;
    const TensorMap& same = pair == &released0 ? kept0 : kept1;
    for (const auto& [name, t] : released) {
      if (name != "peak_stash") {
        EXPECT_TRUE(torch::equal(t, same.at(name))) << name;  // gradients, in flight
      }
    }
  }
  TensorMap grads = merged(out_, "released", 2);
  grads.erase("peak_stash");
  grads.erase("peak_inflight");
  TensorMap want = in_process_grads("1f1b", 2);
  want.erase("loss");
  expect_equal(grads, want, "released");

  // The planner, with the link's copy in the profile, predicts both stashes.
  const Data d = global_batch(0);
  auto profile = std::make_shared<ModelProfile>(profile_model(
      seeded_mlp(), d.x.tensor_split(kMicrobatches)[0], d.y.tensor_split(kMicrobatches)[0], mse,
      ProfileOptions().warmup(0).repeats(1).two_sizes(false).action_overhead(false)));
  profile->link = LinkProfile{"c10d (as measured)", 50e-6, 1e9};
  const auto options = synchronous_case("1f1b").workers(2).profile(profile);
  const Prediction releasing = predict_step(seeded_mlp(), options, kBatch);
  const Prediction keeping = predict_step(seeded_mlp(), PipelineOptions(options).free_sent_activations(false), kBatch);
  EXPECT_EQ(releasing.predicted[0].stash_bytes, 0);
  EXPECT_EQ(keeping.predicted[0].stash_bytes, kept);
  EXPECT_EQ(keeping.predicted[1].stash_bytes, releasing.predicted[1].stash_bytes);
  EXPECT_EQ(keeping.predicted[1].stash_bytes, kept1.at("peak_stash")[1].item<int64_t>());
}

TEST_F(TwoRanks, TiedWeightsInTwoProcessesStayBitIdenticalAndMatchInProcess) {
  expect_success(exits_);
  const TensorMap got = merged(out_, "tied", 2);
  ASSERT_TRUE(got.count("0.weight") && got.count("2.weight"));
  EXPECT_TRUE(torch::equal(got.at("0.weight"), got.at("2.weight"))) << "the copies drifted apart";
  auto sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.5).momentum(0.9));
  };
  StageRunner pipe(seeded_tied_lm(), tied_lm_options().workers(2).optimizer(sgd));
  for (int step = 0; step < kTiedSteps; ++step) {
    const auto [x, y] = tied_lm_batch(step);
    pipe.train_step(x, y, lm_loss);
  }
  expect_equal(got, values_of(pipe.named_parameters()), "tied LM K=2 after 5 steps");
  EXPECT_FALSE(torch::equal(got.at("0.weight"), values_of(seeded_tied_lm()).at("0.weight"))) << "it did not train";
}

class FourRanks : public Job {
 protected:
  static void SetUpTestSuite() {
    out_ = scratch("four");
    exits_ = launch("four", 4, out_);
  }
  static void TearDownTestSuite() { fs::remove_all(out_); }
  static inline std::string out_;
  static inline std::vector<RankExit> exits_;
};

TEST_F(FourRanks, EveryRankSucceeds) { expect_success(exits_); }

TEST_F(FourRanks, SynchronousGradientsEqualTheInProcessRuntime) {
  expect_success(exits_);
  for (const std::string& schedule : synchronous_cases()) {
    expect_equal(merged(out_, schedule, 4), in_process_grads(schedule, 4), schedule + " K=4");
  }
}

// Two chunks per process in a V across four processes: rank r runs stages r
// and 7 - r, the turn at stage 3 to 4 stays in rank 3, and the loss is on
// rank 0.
TEST_F(FourRanks, VSchedulesWithTwoChunksPerProcessEqualTheInProcessRuntime) {
  expect_success(exits_);
  const Data d = global_batch(0);
  for (const std::string& schedule : four_rank_v_cases()) {
    StageRunner pipe(seeded_deep_mlp(), four_rank_v_case(schedule).workers(4));
    EXPECT_EQ(pipe.num_stages(), 8) << schedule;
    const StepResult r = pipe.train_step(d.x, d.y, mse);
    TensorMap want = grads_of(pipe.named_parameters());
    want["loss"] = at::full({1}, r.loss, at::kDouble);
    const TensorMap got = merged(out_, "v4-" + schedule, 4);
    EXPECT_EQ(got.size(), 11u) << schedule;  // 5 linear layers' weights and biases, and the loss
    expect_equal(got, want, schedule + " K=4 in a V");
  }
}

TEST_F(FourRanks, PipeDreamWeightsEqualTheInProcessRuntime) {
  expect_success(exits_);
  expect_equal(merged(out_, "pipedream", 4), in_process_pipedream(4), "pipedream K=4");
}

TEST_F(FourRanks, HybridTwoReplicasOfTwoStagesEqualSingleProcessTraining) {
  expect_success(exits_);
  std::vector<double> losses;
  const TensorMap want = single_process_sgd(0.1, &losses);
  for (int replica = 0; replica < 2; ++replica) {
    TensorMap got;
    for (int stage = 0; stage < 2; ++stage) {
      for (auto& [name, t] : read_tensors(out_ + "/hybrid-rank" + std::to_string(replica * 2 + stage) + ".pt")) {
        got[name] = t;
      }
    }
    expect_equal(got, want, "hybrid replica " + std::to_string(replica));
  }
  // The logging rank holds the whole model after gather_model(), and the
  // global losses.
  TensorMap gathered = read_tensors(out_ + "/hybrid-gathered.pt");
  const at::Tensor got_losses = gathered["losses"];
  gathered.erase("losses");
  expect_equal(gathered, want, "gathered on rank 0");
  ASSERT_EQ(got_losses.numel(), kSteps);
  for (int step = 0; step < kSteps; ++step) EXPECT_NEAR(got_losses[step].item<double>(), losses[step], kTolerance);
}

TEST_F(FourRanks, HybridAdamUnderEveryScheduleFamilyEqualsSingleProcessTraining) {
  expect_success(exits_);
  expect_hybrid_schedules(out_, single_process(adam_001()));
}

// The overflow on rank 0 reaches rank 2 through the replicas' average, ranks 1 and 3 through the verdict.
TEST_F(FourRanks, HybridClippingAndAnOverflowOnOneRankEqualOneProcess) { expect_training_options(out_, 4); }

TEST_F(FourRanks, HybridPipeDreamOnTheSameDataEqualsOnePipeline) {
  expect_success(exits_);
  const TensorMap want = in_process_pipedream(2);
  for (int replica = 0; replica < 2; ++replica) {
    TensorMap got;
    for (int stage = 0; stage < 2; ++stage) {
      const std::string file = out_ + "/hybrid-pipedream-rank" + std::to_string(replica * 2 + stage) + ".pt";
      for (auto& [name, t] : read_tensors(file)) got[name] = t;
    }
    expect_equal(got, want, "hybrid pipedream replica " + std::to_string(replica));
  }
}

// A rank that dies mid-step: the others notice it well within the timeout
// (Gloo's socket closes), naming it.
TEST(DistributedFaults, ADeadPeerStopsEveryOtherRankWithinTheTimeout) {
  const std::string out = scratch("dead");
  const auto exits = launch(
      "faulty", 3, out,
      {{"CONVEYOR_TEST_TRIP", "exit:3"}, {"CONVEYOR_TEST_TRIP_RANK", "1"}, {"CONVEYOR_TEST_TIMEOUT_MS", "5000"}});
  fs::remove_all(out);
  expect_dead_peer_noticed(exits, 5000);
}

// A rank that stalls: its neighbours give up after the timeout, not later.
TEST(DistributedFaults, AStalledPeerTimesOut) {
  const std::string out = scratch("stall");
  const auto exits = launch(
      "faulty", 3, out,
      {{"CONVEYOR_TEST_TRIP", "stall:2"}, {"CONVEYOR_TEST_TRIP_RANK", "1"}, {"CONVEYOR_TEST_TIMEOUT_MS", "1000"}});
  fs::remove_all(out);
  expect_stalled_peer_timed_out(exits);
}

// ---------------------------------------------------------------------------
// In one process.

TEST(DataParallelBaseline, LibTorchDataParallelOnTheCpuEqualsPlainTraining) {
  auto model = seeded_mlp();
  torch::optim::SGD sgd(model->parameters(), 0.1);
  std::vector<double> losses, want_losses;
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    losses.push_back(data_parallel_step(model, sgd, s.x, s.y, mse, {torch::kCPU}));
  }
  expect_equal(values_of(model), single_process_sgd(0.1, &want_losses), "data_parallel on cpu");
  for (int step = 0; step < kSteps; ++step) EXPECT_NEAR(losses[step], want_losses[step], kTolerance);
}

}  // namespace
}  // namespace conveyor::testing

int main(int argc, char** argv) {
  if (const char* role = std::getenv("CONVEYOR_TEST_ROLE")) return conveyor::testing::run_worker(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
