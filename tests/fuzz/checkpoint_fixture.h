#pragma once
// The small fixed pipeline that the checkpoint fuzzer loads into, and that
// make_checkpoint_seeds.cpp saves its seed checkpoints from: the layers
// Linear(4, 3), BatchNorm1d(3), ReLU, Linear(3, 2) on two stages (split before
// layer 2), in three set-ups:
//   kCaller:    a synchronous schedule, the caller's Adam over every parameter;
//   kOwn:       an asynchronous one with the pipeline's own SGD (momentum 0.9)
//               per stage and each stage's own random streams (CPU);
//   kOwnSync:   a synchronous one with the pipeline's own SGD per stage.
// The fuzzer also loads into the kOwnSync pipeline cut in three stages
// (before layers 1 and 3; kResharded): what is per stage is regrouped.

#include <torch/torch.h>

namespace conveyor::fuzzing {

enum class Setup { kCaller, kOwn, kOwnSync, kResharded };

inline torch::nn::Sequential fixture_model() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::ReLU(),
                               torch::nn::Linear(3, 2));
}

constexpr int64_t kSplit = 2;  // the first layer of stage 1
// kResharded's stages: layers [0, 1), [1, 3), [3, 4).
inline const std::vector<int64_t>& resharded_boundaries() {
  static const std::vector<int64_t> b = {1, 3};
  return b;
}

inline std::unique_ptr<torch::optim::Optimizer> caller_adam(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

inline std::unique_ptr<torch::optim::Optimizer> stage_sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

}  // namespace conveyor::fuzzing
