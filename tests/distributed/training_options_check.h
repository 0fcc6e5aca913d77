#pragma once
// The multi-process tests' comparison (expect_equal), and what the
// training-options role (distributed_roles.h) computes in one process, with
// the check that every rank agrees with it: clipping by global
// norm on the global batch, and a loss scaler whose overflow (on rank 0 alone
// in the job) is this pipeline's. Used by tests/distributed/test_distributed.cpp.

#include "distributed_roles.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace conveyor::testing {

// Every tensor of `want` is in `got`, within 1e-10.
inline void expect_equal(const TensorMap& got, const TensorMap& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (const auto& [name, w] : want) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << where << ": no " << name;
    ASSERT_TRUE(it->second.defined() && w.defined()) << where << ": " << name << " undefined";
    const double diff = (it->second - w).abs().max().item<double>();
    EXPECT_LE(diff, 1e-10) << where << ": " << name << " differs by " << diff;
  }
}

inline TensorMap single_process_clipped(std::vector<double>* norms) {
  auto model = seeded_mlp();
  auto opt = sgd_momentum()(model->parameters());
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    opt->zero_grad();
    mse(model->forward(s.x), s.y).backward();
    norms->push_back(torch::nn::utils::clip_grad_norm_(model->parameters(), 0.05));
    opt->step();
  }
  return values_of(model);
}

inline TensorMap in_process_scaled(std::vector<double>* scales, std::vector<double>* skipped) {
  auto factor = std::make_shared<double>(1.0);
  StageRunner pipe(bomb_model(factor), scaled_options().workers(2));
  for (int step = 0; step < kSteps + 1; ++step) {
    *factor = step == kOverflowStep ? std::numeric_limits<double>::infinity() : 1.0;
    const Data s = global_batch(step);
    const StepResult r = pipe.train_step(s.x, s.y, mse);
    scales->push_back(r.loss_scale);
    skipped->push_back(r.skipped_updates);
  }
  return values_of(pipe.named_parameters());
}

// Every rank of `ranks` clipped by the global norm and skipped the step that
// overflowed on rank 0 alone, as one process does.
inline void expect_training_options(const std::string& out, int ranks) {
  std::vector<double> norms, scales, skipped;
  const TensorMap clipped = single_process_clipped(&norms);
  const TensorMap scaled = in_process_scaled(&scales, &skipped);
  ASSERT_EQ(skipped, std::vector<double>({0, 1, 0, 0})) << "the reference must overflow at step 1";
  for (int replica = 0; replica < ranks / 2; ++replica) {
    TensorMap clip, scaler;
    for (int worker = 0; worker < 2; ++worker) {
      const int rank = replica * 2 + worker;
      TensorMap c = read_tensors(out + "/clip-rank" + std::to_string(rank) + ".pt");
      TensorMap s = read_tensors(out + "/scaler-rank" + std::to_string(rank) + ".pt");
      const std::string where = "rank " + std::to_string(rank);
      for (int step = 0; step < kSteps; ++step) EXPECT_NEAR(c["norms"][step].item<double>(), norms[step], 1e-10) << where;
      for (size_t step = 0; step < scales.size(); ++step) {
        EXPECT_EQ(s["scales"][step].item<double>(), scales[step]) << where << " step " << step;
        EXPECT_EQ(s["skipped"][step].item<double>(), skipped[step]) << where << " step " << step;
      }
      c.erase("norms");
      s.erase("scales");
      s.erase("skipped");
      clip.insert(c.begin(), c.end());
      scaler.insert(s.begin(), s.end());
    }
    expect_equal(clip, clipped, "clipped, replica " + std::to_string(replica));
    expect_equal(scaler, scaled, "loss-scaled, replica " + std::to_string(replica));
  }
}

// Two ranks under bf16 autocast: the same gradients, bit for bit, as the
// in-process pipeline, whose activations cross in bf16.
inline void expect_bf16_as_in_process(const std::string& out) {
  StageRunner pipe(seeded_fp32_mlp(), autocast_options().workers(2));
  const Data d = global_batch(0);
  const StepResult r = pipe.train_step(d.x.to(torch::kFloat32), d.y.to(torch::kFloat32), mse);
  EXPECT_EQ(r.activation_bytes_sent[0], kBatch * 16 * 2) << "bf16 activations: 2 bytes an element";
  TensorMap want = grads_of(pipe.named_parameters());
  want["loss"] = at::full({1}, r.loss, at::kDouble);
  TensorMap got;
  for (int rank = 0; rank < 2; ++rank) {
    for (auto& [name, t] : read_tensors(out + "/bf16-rank" + std::to_string(rank) + ".pt")) got[name] = t;
  }
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
}

}  // namespace conveyor::testing
