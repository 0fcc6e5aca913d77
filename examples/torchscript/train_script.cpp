// Recipe, second half: the TorchScript model that save_model.py wrote,
// loaded and trained from C++: cut before blocks.2 into 2 stages under 1F1B,
// the pipeline's own AdamW stepping each stage, then evaluated on held-out
// data. In one process the stages run on 2 threads; under torchrun each of
// 2 processes runs one stage, over torch.distributed's Gloo. Both train the
// same model to the same loss. Exits 1 unless the held-out loss falls to a
// quarter.
//
//   python examples/torchscript/save_model.py regressor.pt
//   build/examples/train_script regressor.pt
//   torchrun --nproc-per-node=2 --no-python build/examples/train_script regressor.pt
#include <conveyor/conveyor.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

namespace {

// A smooth target of 16 inputs, the same in every process.
std::pair<at::Tensor, at::Tensor> data(int64_t samples, int64_t seed) {
  torch::manual_seed(seed);
  const at::Tensor x = torch::randn({samples, 16});
  return {x, torch::sin(x.narrow(1, 0, 8)).sum(1, /*keepdim=*/true) * 0.5};
}

int run(const std::string& path) {
  // torchrun's variables; without them, one process.
  const auto env = conveyor::LaunchEnvironment::from_environment();
  const auto options = conveyor::PipelineOptions()
                           .split_points({"blocks.2"})
                           .workers(2)
                           .microbatches(4)
                           .schedule("1f1b")
                           .optimizer(conveyor::OptimizerName::kAdamW)
                           .lr(3e-3)
                           .timeout(std::chrono::seconds(60));
  std::shared_ptr<conveyor::ProcessGroups> groups;  // none: every stage in this process
  if (env.world_size > 1) {                         // one stage a process
    groups = std::make_shared<conveyor::ProcessGroups>(
        conveyor::connect_store(env, std::chrono::minutes(1)), env.rank,
        conveyor::HybridLayout::for_world(env.world_size, /*workers=*/2), conveyor::ProcessGroups::Options{});
  }
  conveyor::Pipeline pipe(path, options, groups);  // a path: loaded with torch::jit::load
  const auto mse = [](const at::Tensor& out, const at::Tensor& target) { return torch::mse_loss(out, target); };
  const auto [x_test, y_test] = data(256, /*seed=*/1000);
  const auto held_out = [&]() -> double {  // on the last stage's process; -1 elsewhere
    pipe.eval();
    const at::Tensor out = pipe.forward(x_test);
    pipe.train();
    return out.defined() ? torch::mse_loss(out, y_test).item<double>() : -1;
  };
  const double before = held_out();
  for (int step = 0; step < 200; ++step) {
    const auto [x, y] = data(64, step);
    const double loss = pipe.train_step(x, y, mse).loss;  // the whole batch's, in every process
    if (env.rank == 0 && step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, loss);
  }
  const double after = held_out();
  if (after < 0) return 0;  // another process holds the output
  std::printf("held-out loss %.4f -> %.6f\n", before, after);
  if (!(after < before / 4)) {
    std::fprintf(stderr, "train_script: the held-out loss did not fall to a quarter\n");
    return 1;
  }
  std::printf("PASS: held-out loss %.6f\n", after);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? argv[1] : "regressor.pt");
  } catch (const std::exception& e) {
    std::cerr << "train_script: " << e.what() << std::endl;
    return 1;
  }
}
