// The README's C++ example, whole: an MLP cut into 2 stages under 1F1B.
#include <conveyor/conveyor.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  conveyor::Pipeline pipe(model, conveyor::PipelineOptions().workers(2).microbatches(4).schedule("1f1b"));
  torch::optim::Adam opt(pipe.parameters(), 1e-2);
  const at::Tensor x = torch::randn({256, 8}), y = x.pow(2).sum(1, /*keepdim=*/true);
  const auto mse = [](const at::Tensor& out, const at::Tensor& target) { return torch::mse_loss(out, target); };
  double first = 0, loss = 0;
  for (int step = 0; step < 100; ++step) {
    loss = pipe.train_step(x, y, mse).loss;  // the whole batch's loss and gradients
    opt.step();
    opt.zero_grad();
    if (step == 0) first = loss;
  }
  std::printf("loss %.3f -> %.3f\n", first, loss);
  return loss < 0.2 * first ? 0 : 1;  // the test runs this file
}
