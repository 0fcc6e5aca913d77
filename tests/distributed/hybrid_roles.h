#pragma once
// The hybrid under every synchronous schedule family (one stage a worker,
// two, split backwards, the V shape): D = 2 replicas of a K = 2 worker
// pipeline train with Adam, each stage's gradients reduced across the
// replicas where the schedule's REDUCE_GRAD stands, while the worker goes on;
// the weights must be plain training's on the global batch.

#include "distributed/training_options_check.h"
#include "distributed_roles.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace conveyor::testing {

inline constexpr const char* kHybridSchedules[] = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};

inline OptimizerFactory adam_001() {
  return [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::Adam>(p, 0.01); };
}

// Each schedule's weights, and the number of REDUCE_GRAD actions in each
// schedule the pipeline ran.
inline void hybrid_schedules(Worker& w) {
  auto groups = w.groups("hybrid-schedules", 2, std::chrono::seconds(20));
  const int d = groups->replica(), replicas = groups->layout().replicas;
  std::string reductions;
  for (const char* schedule : kHybridSchedules) {
    DistributedRunner pipe(seeded_mlp(), PipelineOptions().microbatches(2).schedule(schedule).optimizer(adam_001()),
                           groups);
    for (int step = 0; step < kSteps; ++step) {
      const Data s = global_batch(step);
      pipe.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
    }
    write_tensors(w.file(std::string("hybrid-adam-") + schedule), values_of(pipe.named_parameters()));
    const std::string text = pipe.runner().schedule().str();
    size_t count = 0;
    for (size_t at = text.find("REDUCE_GRAD"); at != std::string::npos; at = text.find("REDUCE_GRAD", at + 1)) ++count;
    reductions += std::string(schedule) + " " + std::to_string(count) + "\n";
  }
  w.note("hybrid-reductions", reductions);
  groups->barrier();
}

// Every replica's weights (its two workers' files merged) within 1e-10 of
// `want`, and one REDUCE_GRAD a stage.
inline void expect_hybrid_schedules(const std::string& out, const TensorMap& want) {
  for (const char* schedule : kHybridSchedules) {
    for (int replica = 0; replica < 2; ++replica) {
      TensorMap got;
      for (int worker = 0; worker < 2; ++worker) {
        const std::string file = out + "/hybrid-adam-" + schedule + "-rank" + std::to_string(replica * 2 + worker);
        for (auto& [name, t] : read_tensors(file + ".pt")) got[name] = t;
      }
      expect_equal(got, want, std::string(schedule) + " replica " + std::to_string(replica));
    }
  }
  std::ifstream in(out + "/hybrid-reductions-rank0.txt");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "gpipe 2\n1f1b 2\ninterleaved 4\nzb-h1 2\nzb-v 4\n");
}

}  // namespace conveyor::testing
