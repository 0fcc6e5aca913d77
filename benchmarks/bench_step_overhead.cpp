// The runtime's own cost per step, where compute is tiny: N steps of a
// 1F1B pipeline of eight 16x16 linear layers (batch 16, M = 8) after a
// warm-up. Run it under callgrind for N and 2N steps: the difference of the
// instruction counts over N is the instructions per step, repeatable whatever
// else the machine does (see benchmarks/results/step_overhead.md).
//
//   valgrind --tool=callgrind ./build/benchmarks/bench_step_overhead 10 2
//   valgrind --tool=callgrind ./build/benchmarks/bench_step_overhead 30 2
#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::printf("usage: bench_step_overhead [STEPS=10] [STAGES=2]\n");
    return 0;
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int stages = argc > 2 ? std::atoi(argv[2]) : 2;
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({16, 16}), y = torch::randn({16, 16});
  const conveyor::LossFn loss = [](const at::Tensor& o, const at::Tensor& t) { return torch::mse_loss(o, t); };
  torch::nn::Sequential model;
  for (int i = 0; i < 8; ++i) model->push_back(torch::nn::Linear(16, 16));
  conveyor::Pipeline pipe(model, conveyor::PipelineOptions().workers(stages).microbatches(8).schedule("1f1b"));
  for (int i = 0; i < 3; ++i) pipe.train_step(x, y, loss);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) pipe.train_step(x, y, loss);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("K=%d M=8: %d steps, %.1f us per step\n", stages, steps, us / std::max(steps, 1));
  return 0;
}
