// A model, a pipeline, a training loop: two workers run the MLP's two stages
// under 1F1B on four micro-batches per step. Exits 1 unless the loss falls.
#include <conveyor/conveyor.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                              torch::nn::ReLU(), torch::nn::Linear(64, 1));
  conveyor::Pipeline pipe(model, conveyor::PipelineOptions().workers(2).microbatches(4).schedule("1f1b"));
  std::cout << pipe.plan().str() << "\n" << pipe.schedule().str();

  torch::optim::Adam optimizer(pipe.parameters(), 1e-2);
  const auto loss_fn = [](const at::Tensor& out, const at::Tensor& target) { return torch::mse_loss(out, target); };
  const at::Tensor x = torch::randn({256, 8});
  const at::Tensor y = x.pow(2).sum(1, /*keepdim=*/true);
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    optimizer.zero_grad();
    const conveyor::StepResult r = pipe.train_step(x, y, loss_fn);  // the whole batch's loss and gradients
    optimizer.step();
    if (step == 0) first = r.loss;
    last = r.loss;
    if (step % 25 == 0) std::cout << "step " << step << "  loss " << r.loss << "\n";
  }
  std::cout << "loss " << first << " -> " << last << "\n";
  return last < 0.2 * first ? 0 : 1;
}
