#pragma once
// The ranks of the sharded-optimizer tests (tests/distributed/test_sharded_optimizer.cpp):
// D = 2 replicas of a K = 2 worker pipeline train the same cases with the
// optimizer state sharded across the replicas (ZeRO-1), with the gradients
// too (ZeRO-2), with the parameters too (ZeRO-3) and without, and write
// each; the tests compare them.

#include "distributed_roles.h"
#include "distributed_tensor_roles.h"
#include "plugin/distributed/sharded_optimizer.h"

#include <torch/optim/lbfgs.h>

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace conveyor::testing {

constexpr int kShardedSteps = 5;
// 1F1B of 2 workers and 2 micro-batches with a REDUCE_GRAD after every backward.
constexpr const char* kReducedPerMicrobatch =
    "0F0 0F1 0B0 0REDUCE_GRAD 0B1 0REDUCE_GRAD\n1F0 1B0 1REDUCE_GRAD 1F1 1B1 1REDUCE_GRAD\n";
// The same with the parameters gathered for each forward and backward and
// released after it: each backward finds its stage's weights refilled since
// its forward.
constexpr const char* kGatheredPerAction =
    "0UNSHARD 0F0 0RESHARD 0UNSHARD 0F1 0RESHARD 0UNSHARD 0B0 0RESHARD 0REDUCE_GRAD 0UNSHARD 0B1 0RESHARD "
    "0REDUCE_GRAD\n"
    "1UNSHARD 1F0 1RESHARD 1UNSHARD 1B0 1RESHARD 1REDUCE_GRAD 1UNSHARD 1F1 1RESHARD 1UNSHARD 1B1 1RESHARD "
    "1REDUCE_GRAD\n";

struct ShardedCase {
  std::string name;
  std::function<torch::nn::Sequential()> model;
  PipelineOptions options;  // the distributed section's options included
  bool tied_lm = false;                   // the tied LSTM LM on its token batches, else the MLP
  std::shared_ptr<double> bomb;           // the bomb model's factor: infinite at kOverflowStep on rank 0
  // The sharded levels it trains at (against kNone), and the schedules it
  // gives at kGradients and kParameters (empty: the options').
  std::vector<ShardLevel> levels = {ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters};
  std::string gradients_schedule_text{};
  std::string parameters_schedule_text{};
};

// The file a level's run of a case writes.
inline std::string variant_name(ShardLevel level) {
  const char* names[] = {"plain", "sharded", "gradients", "parameters"};
  return names[static_cast<int>(level)];
}

inline std::vector<ShardedCase> sharded_cases() {
  auto adam = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
  };
  auto adamw = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  };
  auto decaying = [](int64_t n) { return 0.01 / (1.0 + static_cast<double>(n)); };
  std::vector<ShardedCase> cases;
  cases.push_back({"adam-1f1b", seeded_mlp,
                   PipelineOptions().microbatches(2).schedule("1f1b").optimizer(adam).lr_schedule(decaying), false,
                   nullptr});
  cases.push_back({"sgd-gpipe", seeded_mlp,
                   PipelineOptions().microbatches(2).schedule("gpipe").optimizer(sgd_momentum()).scale_learning_rate(
                       true),
                   false, nullptr});
  cases.push_back({"adamw-interleaved", seeded_mlp,
                   PipelineOptions().microbatches(2).schedule("interleaved").optimizer(adamw), false, nullptr});
  // Split backwards: each stage's reduce-scatter after its last W.
  cases.push_back({"adam-zb-h1", seeded_mlp, PipelineOptions().microbatches(2).schedule("zb-h1").optimizer(adam), false,
                   nullptr});
  cases.push_back({"adam-zb-v", seeded_mlp, PipelineOptions().microbatches(2).schedule("zb-v").optimizer(adam), false,
                   nullptr});
  auto factor = std::make_shared<double>(1.0);
  cases.push_back(
      {"clip-scale", [factor] { return bomb_model(factor); }, scaled_options().clip_grad_norm(0.05), false, factor});
  auto sgd = [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.5).momentum(0.9));
  };
  cases.push_back({"tied", seeded_tied_lm, tied_lm_options().optimizer(sgd), true, nullptr});
  // A frozen weight (no gradient, a piece all the same), and updates every
  // second step (the gradients of two steps reduced at once).
  auto frozen = [] {
    torch::nn::Sequential m = seeded_mlp();
    m->named_parameters()["0.bias"].set_requires_grad(false);
    return m;
  };
  cases.push_back({"frozen-accumulated", frozen,
                   PipelineOptions().microbatches(2).schedule("1f1b").optimizer(adam).accumulate_steps(2), false,
                   nullptr});
  // ZeRO-2 with a reduce-scatter after every backward (the given schedule's
  // REDUCE_GRADs): each replica accumulates its pieces, sums in another order.
  ShardedCase per_microbatch{"adam-per-microbatch", seeded_mlp,
                             PipelineOptions().microbatches(2).schedule("1f1b").optimizer(adam), false, nullptr};
  per_microbatch.levels = {ShardLevel::kGradients, ShardLevel::kParameters};
  per_microbatch.gradients_schedule_text = kReducedPerMicrobatch;
  per_microbatch.parameters_schedule_text = kGatheredPerAction;
  cases.push_back(per_microbatch);
  return cases;
}

// The bytes of the gradients a stage holds for its update: its live
// weights' and its gradient pieces' (ZeRO-2), of this process's stages.
inline double update_gradient_bytes(const StageRunner& runner) {
  double bytes = 0;
  for (int s = 0; s < runner.num_stages(); ++s) {
    if (!runner.is_local(s)) continue;
    const Stage& stage = runner.stage(s);
    std::vector<at::Tensor> holders = stage.live();
    if (&stage.gradient_holders() != &stage.live()) {
      holders.insert(holders.end(), stage.gradient_holders().begin(), stage.gradient_holders().end());
    }
    for (const auto& t : holders) {
      if (t.grad().defined()) bytes += static_cast<double>(t.grad().numel() * t.grad().element_size());
    }
  }
  return bytes;
}

// The bytes of weights this process's stages hold: their live weights'
// storage (none outside a step at kParameters) and the optimizer's pieces
// where they are the weights' values (kParameters).
inline double resident_weight_bytes(const StageRunner& runner) {
  double bytes = 0;
  for (int s = 0; s < runner.num_stages(); ++s) {
    if (!runner.is_local(s)) continue;
    const Stage& stage = runner.stage(s);
    for (const auto& w : stage.live()) bytes += static_cast<double>(w.storage().nbytes());
    if (stage.parameter_shards()) {
      for (const auto& p : *stage.parameter_shards()->gradient_pieces()) {
        bytes += static_cast<double>(p.numel() * p.element_size());
      }
    }
  }
  return bytes;
}

// kShardedSteps steps of `c` on this replica's shard of each global batch at
// `level`; the weights, the losses, norms, scales and skips, the optimizer
// bytes, and the most gradient bytes held at an update (update_gradient_bytes,
// read where the learning-rate schedule is asked, just before the step).
inline TensorMap train_case(Worker& w, const std::shared_ptr<ProcessGroups>& groups, const ShardedCase& c,
                            ShardLevel level) {
  const int d = groups->replica(), replicas = groups->layout().replicas;
  PipelineOptions options = PipelineOptions(c.options).shard(level);
  if (level == ShardLevel::kGradients && !c.gradients_schedule_text.empty()) {
    options.schedule_text(c.gradients_schedule_text);
  }
  if (level == ShardLevel::kParameters && !c.parameters_schedule_text.empty()) {
    options.schedule_text(c.parameters_schedule_text);
  }
  auto runner = std::make_shared<const StageRunner*>(nullptr);
  auto gradient_bytes = std::make_shared<double>(0);
  if (options.lr_schedule()) {
    options.lr_schedule([inner = options.lr_schedule(), runner, gradient_bytes](int64_t n) {
      if (*runner) *gradient_bytes = std::max(*gradient_bytes, update_gradient_bytes(**runner));
      return inner(n);
    });
  }
  DistributedRunner pipe(c.model(), options, groups);
  *runner = &pipe.runner();
  std::vector<double> losses, norms, scales, skipped;
  for (int step = 0; step < kShardedSteps; ++step) {
    if (c.bomb) *c.bomb = step == kOverflowStep && w.env.rank == 0 ? std::numeric_limits<double>::infinity() : 1.0;
    StepResult r;
    if (c.tied_lm) {
      const auto [x, y] = tied_lm_batch(step);
      r = pipe.train_step(shard(x, d, replicas), shard(y, d, replicas), lm_loss);
    } else {
      const Data s = global_batch(step);
      r = pipe.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
    }
    losses.push_back(r.loss);
    norms.push_back(r.grad_norm);
    scales.push_back(r.loss_scale);
    skipped.push_back(r.skipped_updates);
  }
  const double resident = resident_weight_bytes(pipe.runner());
  pipe.unshard();  // at kParameters: the weights whole to be written
  TensorMap out = values_of(pipe.named_parameters());
  out["resident_weight_bytes"] = at::full({1}, resident, at::kDouble);
  out["losses"] = torch::tensor(losses, at::kDouble);
  out["norms"] = torch::tensor(norms, at::kDouble);
  out["scales"] = torch::tensor(scales, at::kDouble);
  out["skipped"] = torch::tensor(skipped, at::kDouble);
  out["state_bytes"] = at::full({1}, static_cast<double>(pipe.optimizer_state_bytes()), at::kDouble);
  out["gradient_bytes"] = at::full({1}, *gradient_bytes, at::kDouble);
  return out;
}

// Adam, sharded at `saved_at`: 3 steps, a checkpoint (each rank its own
// file, its replica's part of the state), 2 more; a fresh sharded pipeline
// at each level that loads its own file (its optimizer state, or its
// gradients too, or its parameters too), and a fresh unsharded one that
// loads every rank's files, take the same 2 steps.
inline void resumed(Worker& w, const std::shared_ptr<ProcessGroups>& groups, ShardLevel saved_at) {
  const ShardedCase c = sharded_cases().front();
  const int d = groups->replica(), replicas = groups->layout().replicas;
  auto run = [&](DistributedRunner& pipe, int from, int to) {
    for (int step = from; step < to; ++step) {
      const Data s = global_batch(step);
      pipe.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
    }
  };
  const auto weights = [](DistributedRunner& pipe) {
    pipe.unshard();
    return values_of(pipe.named_parameters());
  };
  const std::string from = variant_name(saved_at);
  DistributedRunner pipe(c.model(), PipelineOptions(c.options).shard(saved_at), groups);
  run(pipe, 0, 3);
  save_checkpoint(w.file(from + "-ckpt"), pipe.runner(), {3, {}});
  run(pipe, 3, kShardedSteps);
  write_tensors(w.file(from + "-resume-uninterrupted"), weights(pipe));
  for (const ShardLevel level :
       {ShardLevel::kOptimizer, ShardLevel::kGradients, ShardLevel::kParameters, ShardLevel::kNone}) {
    torch::manual_seed(9);
    const bool sharded = level != ShardLevel::kNone;
    DistributedRunner fresh(make_mlp(), PipelineOptions(c.options).shard(level), groups);
    std::vector<std::string> every_rank;
    for (int r = 0; r < w.env.world_size; ++r) {
      every_rank.push_back(w.out + "/" + from + "-ckpt-rank" + std::to_string(r) + ".pt");
    }
    const int64_t step = sharded ? load_checkpoint(w.file(from + "-ckpt"), fresh.runner())
                                 : load_checkpoint_files(every_rank, fresh.runner());
    run(fresh, static_cast<int>(step), kShardedSteps);
    write_tensors(w.file(from + "-resume-" + variant_name(level)), weights(fresh));
  }
}

// What a sharded configuration that cannot work says.
inline std::string refusal(const std::function<void()>& build) {
  try {
    build();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

inline void sharded(Worker& w) {
  auto groups = w.groups("sharded", 2, std::chrono::seconds(20));
  for (const ShardedCase& c : sharded_cases()) {
    write_tensors(w.file(c.name + "-plain"), train_case(w, groups, c, ShardLevel::kNone));
    for (const ShardLevel level : c.levels) {
      write_tensors(w.file(c.name + "-" + variant_name(level)), train_case(w, groups, c, level));
    }
  }
  resumed(w, groups, ShardLevel::kOptimizer);
  resumed(w, groups, ShardLevel::kParameters);
  const PipelineOptions sharding = PipelineOptions().microbatches(2).shard(ShardLevel::kOptimizer);
  std::string refusals;
  refusals += refusal([&] {
    DistributedRunner(seeded_mlp(), PipelineOptions(sharding).schedule("pipedream").optimizer(sgd_momentum()), groups);
  }) + "\n";
  refusals += refusal([&] {
    auto lbfgs = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::LBFGS>(p); };
    DistributedRunner(seeded_mlp(), PipelineOptions(sharding).optimizer(lbfgs), groups);
  }) + "\n";
  refusals += refusal([&] { DistributedRunner(seeded_mlp(), sharding, groups); }) + "\n";
  // A reduction per micro-batch adds up only where the gradients are sharded.
  refusals += refusal([&] {
    const PipelineOptions options = PipelineOptions(sharding).schedule_text(kReducedPerMicrobatch);
    DistributedRunner(seeded_mlp(), PipelineOptions(options).optimizer(sgd_momentum()), groups);
  });
  w.note("sharded-refusals", refusals);
  groups->barrier();
}

}  // namespace conveyor::testing
