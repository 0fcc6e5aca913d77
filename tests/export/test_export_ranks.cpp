// torch.export programs across processes: the fixtures of test_export.cpp
// (tests/python/make_export_fixtures.py), each cut into K = 2, 3, 4 stages run
// by K processes over c10d (Gloo, loopback) under GPipe and 1F1B (on two
// ranks also zero-bubble, interleaved and PipeDream), against what eager
// PyTorch computes. The test binary starts copies of itself as the
// ranks (rank_launcher.h); each rank loads the .pt2 itself, trains its stage
// and writes the loss, its stage's gradients after the first step and its
// parameters and buffers after three SGD steps, by the model's names.
#include "built_pipeline.h"
#include "export/export_cases.h"
#include "plugin/distributed/distributed_runner.h"
#include "plugin/export/exported.h"
#include "plugin/model/model_names.h"
#include "rank_launcher.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <iostream>

namespace conveyor::testing {
namespace {

namespace fs = std::filesystem;

// GPipe and 1F1B on 2, 3 and 4 ranks; on 2 ranks also zero-bubble, two
// chunks per process (interleaved) and PipeDream (asynchronous: compared with
// the in-process pipeline rather than eager PyTorch).
std::vector<std::string> schedules_for(int world) {
  if (world == 2) return {"gpipe", "1f1b", "zb-h1", "interleaved", "pipedream"};
  return {"gpipe", "1f1b"};
}

const std::vector<std::string>& split_for(const ExportCase& c, const std::string& schedule, int world) {
  return c.splits.at(schedule == "interleaved" ? 2 * world - 2 : world - 2);
}

OptimizerFactory momentum_sgd() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}

PipelineOptions options_for(const std::string& schedule) {
  auto options = PipelineOptions().microbatches(4).schedule(schedule).timeout(std::chrono::seconds(60));
  return schedule == "pipedream" ? options.optimizer(momentum_sgd()) : options;
}

std::string result_file(const std::string& out, const std::string& model, const std::string& schedule, int rank) {
  return out + "/" + model + "-" + schedule + "-rank" + std::to_string(rank) + ".pt";
}

// One rank: every model under every schedule, one stage per process.
int run_rank() {
  torch::set_num_threads(1);
  try {
    const LaunchEnvironment env = LaunchEnvironment::from_environment();
    const std::string out = std::getenv("CONVEYOR_TEST_OUT");
    ProcessGroups::Options group_options;
    group_options.name = "export";
    group_options.timeout = std::chrono::seconds(60);
    group_options.connect_timeout = std::chrono::seconds(30);
    auto groups = std::make_shared<ProcessGroups>(connect_store(env, std::chrono::seconds(30)), env.rank,
                                                  HybridLayout::for_world(env.world_size, env.world_size),
                                                  group_options);
    for (const ExportCase& c : export_cases()) {
      const NamedTensors ref = export_reference(c.model);
      const Tensors inputs = numbered(ref, "input."), targets = numbered(ref, "target.");
      for (const std::string& schedule : schedules_for(env.world_size)) {
        DistributedRunner pipe(sequential_from_export(load_exported(export_fixture(c.model + ".pt2")),
                                                        split_for(c, schedule, env.world_size)),
                                 options_for(schedule), groups);
        torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.05));
        NamedTensors result;
        for (int step = 0; step < 3; ++step) {
          sgd.zero_grad();
          const StepResult r = pipe.train_step(inputs, targets, export_loss(c.cross_entropy));
          if (step == 0 && schedule != "pipedream") {
            result["loss"] = at::full({1}, r.loss, at::kDouble);
            for (const auto& [name, p] : model_named_parameters(pipe.runner())) result["grad." + name] = p.grad();
          }
          if (schedule != "pipedream") sgd.step();  // PipeDream steps its own
        }
        for (const auto& [name, t] : model_named_parameters(pipe.runner())) result["step3." + name] = t;
        for (const auto& [name, t] : model_named_buffers(pipe.runner())) result["step3." + name] = t;
        write_tensors(result_file(out, c.model, schedule, env.rank), result);
      }
    }
    groups->barrier();
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}

// What the ranks wrote, in one map.
NamedTensors merged(const std::string& out, const std::string& model, const std::string& schedule, int world) {
  NamedTensors all;
  for (int r = 0; r < world; ++r) {
    for (auto& [name, t] : read_tensors(result_file(out, model, schedule, r))) all[name] = t;
  }
  return all;
}

// PipeDream across two processes against the same in the test's process.
void expect_like_in_process(const ExportCase& c, const NamedTensors& got, const std::string& where) {
  const NamedTensors ref = export_reference(c.model);
  auto pipe = testing::built_pipeline(load_exported(export_fixture(c.model + ".pt2")), options_for("pipedream"),
                                   split_for(c, "pipedream", 2));
  for (int step = 0; step < 3; ++step) {
    pipe->train_step(numbered(ref, "input."), numbered(ref, "target."), export_loss(c.cross_entropy));
  }
  auto want = model_named_parameters(*pipe);
  for (auto& b : model_named_buffers(*pipe)) want.push_back(b);
  EXPECT_EQ(count_prefixed(got, "step3."), want.size()) << where << ": every parameter and buffer on one rank";
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count("step3." + name)) << where << ": no rank has " << name;
    EXPECT_LE((got.at("step3." + name).to(t.scalar_type()) - t).abs().max().item<double>(), 1e-10)
        << where << ": " << name << " after 3 steps, against the in-process pipeline";
  }
}

void expect_ranks_like_eager(int world) {
  const std::string out = (fs::temp_directory_path() / ("conveyor-export-ranks-" + std::to_string(::getpid()) +
                                                        "-" + std::to_string(world)))
                              .string();
  const std::vector<RankExit> exits = launch("export", world, out);
  for (size_t r = 0; r < exits.size(); ++r) {
    ASSERT_EQ(exits[r].code, 0) << "rank " << r << " of " << world << ":\n" << exits[r].log;
  }
  for (const ExportCase& c : export_cases()) {
    const NamedTensors ref = export_reference(c.model);
    for (const std::string& schedule : schedules_for(world)) {
      const std::string where = c.model + " on " + std::to_string(world) + " processes under " + schedule;
      if (schedule == "pipedream") {
        expect_like_in_process(c, merged(out, c.model, schedule, world), where);
        continue;
      }
      std::vector<std::pair<std::string, at::Tensor>> grads, state;
      for (int r = 0; r < world; ++r) {
        const NamedTensors got = read_tensors(result_file(out, c.model, schedule, r));
        ASSERT_TRUE(got.count("loss")) << where << ": rank " << r << " wrote no loss";
        EXPECT_NEAR(got.at("loss").item<double>(), ref.at("loss").item<double>(), 1e-10) << where << ", rank " << r;
        for (const auto& [name, t] : got) {
          if (name.rfind("grad.", 0) == 0) grads.emplace_back(name.substr(5), t);
          if (name.rfind("step3.", 0) == 0) state.emplace_back(name.substr(6), t);
        }
      }
      EXPECT_EQ(grads.size(), count_prefixed(ref, "grad.")) << where << ": every parameter on one rank";
      EXPECT_EQ(state.size(), count_prefixed(ref, "step3.")) << where << ": every parameter and buffer on one rank";
      expect_like_reference(grads, ref, "grad.", where);
      expect_like_reference(state, ref, "step3.", where + " after 3 steps");
    }
  }
  fs::remove_all(out);
}

TEST(ExportedProgramAcrossProcesses, TwoRanksTrainLikeEagerPyTorchUnderGpipe1f1bZeroBubbleInterleavedAndPipeDream) {
  REQUIRE_EXPORT_FIXTURES();
  expect_ranks_like_eager(2);
}

TEST(ExportedProgramAcrossProcesses, ThreeRanksTrainLikeEagerPyTorchUnderGpipeAnd1f1b) {
  REQUIRE_EXPORT_FIXTURES();
  expect_ranks_like_eager(3);
}

TEST(ExportedProgramAcrossProcesses, FourRanksTrainLikeEagerPyTorchUnderGpipeAnd1f1b) {
  REQUIRE_EXPORT_FIXTURES();
  expect_ranks_like_eager(4);
}

}  // namespace
}  // namespace conveyor::testing

int main(int argc, char** argv) {
  if (std::getenv("CONVEYOR_TEST_ROLE")) return conveyor::testing::run_rank();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
