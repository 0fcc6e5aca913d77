#pragma once
// The ranks of the resharding tests (tests/distributed/test_reshard.cpp):
// K = 2 stages x D = 2 replicas train Adam (with a learning-rate schedule)
// 3 steps with the optimizer state sharded across the replicas and without,
// each rank saving its file, then 3 more, saving again; K = 3 stages x D = 1
// then resume from the step-3 files and take the same 3 steps.

#include "distributed_roles.h"
#include "plugin/checkpoint/checkpoint.h"

#include <torch/optim/adam.h>

#include <string>
#include <vector>

namespace conveyor::testing {

inline PipelineOptions reshard_options() {
  auto adam = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  };
  auto decaying = [](int64_t n) { return 0.01 / (1.0 + 0.5 * static_cast<double>(n)); };
  return PipelineOptions().microbatches(2).schedule("1f1b").optimizer(adam).lr_schedule(decaying);
}

inline const char* reshard_variant(bool sharded) { return sharded ? "sharded" : "plain"; }

// Every rank's file of `what` written by a job of `world` ranks.
inline std::vector<std::string> rank_files(const std::string& out, const std::string& what, int world) {
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) files.push_back(out + "/" + what + "-rank" + std::to_string(r) + ".pt");
  return files;
}

// Steps [from, to) of this replica's shard of the global batches.
inline void reshard_steps(DistributedRunner& pipe, ProcessGroups& groups, int from, int to) {
  const int d = groups.replica(), replicas = groups.layout().replicas;
  for (int step = from; step < to; ++step) {
    const Data s = global_batch(step);
    pipe.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
  }
}

inline void reshard_save(Worker& w) {
  auto groups = w.groups("reshard-save", 2, std::chrono::seconds(20));
  for (const bool sharded : {true, false}) {
    const std::string variant = reshard_variant(sharded);
    const ShardLevel level = sharded ? ShardLevel::kOptimizer : ShardLevel::kNone;
    DistributedRunner pipe(seeded_mlp(), PipelineOptions(reshard_options()).shard(level), groups);
    reshard_steps(pipe, *groups, 0, 3);
    save_checkpoint(w.file(variant + "-step3"), pipe.runner(), {3, {}});
    reshard_steps(pipe, *groups, 3, 6);
    save_checkpoint(w.file(variant + "-step6"), pipe.runner(), {6, {}});
  }
  groups->barrier();
}

inline void reshard_resume(Worker& w) {
  auto groups = w.groups("reshard-resume", 3, std::chrono::seconds(20));
  for (const bool sharded : {true, false}) {
    const std::string variant = reshard_variant(sharded);
    DistributedRunner pipe(make_mlp(), reshard_options(), groups);
    const int64_t step = load_checkpoint_files(rank_files(w.out, variant + "-step3", 4), pipe.runner());
    reshard_steps(pipe, *groups, static_cast<int>(step), 6);
    save_checkpoint(w.file("k3-" + variant + "-step6"), pipe.runner(), {6, {}});
  }
  groups->barrier();
}

// 4 ranks save, then 3 resume.
inline void reshard(Worker& w) { w.env.world_size == 4 ? reshard_save(w) : reshard_resume(w); }

}  // namespace conveyor::testing
