// Trains a 2-stage pipeline for a few steps through the installed package and
// checks that the loss falls: proof that headers, library and ops all resolve.
#include <conveyor/conveyor.h>
#include <conveyor/plugin/checkpoint/checkpoint.h>
#include <conveyor/plugin/distributed/data_parallel.h>
#include <conveyor/plugin/distributed/distributed_runner.h>
#include <conveyor/plugin/measure/c10d_link.h>
#if __has_include(<conveyor/plugin/script/torchscript.h>)  // (CONVEYOR_TORCHSCRIPT=ON)
#include <conveyor/plugin/script/torchscript.h>
#endif
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
  conveyor::Pipeline pipe(model, conveyor::PipelineOptions().workers(2).microbatches(4).schedule("gpipe"));
  torch::optim::SGD opt(pipe.parameters(), 0.1);
  const auto x = torch::randn({32, 4});
  const auto y = x.sum(1, true);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const auto r =
        pipe.train_step(x, y, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); });
    opt.step();
    (step == 0 ? first : last) = r.loss;
  }
  const auto ops = c10::Dispatcher::singleton().findOp({"conveyor::schedule", ""});
  // A header from one of the plugin's folders: a checkpoint round trip.
  conveyor::save_checkpoint("consumer.ckpt", pipe, {30, {&opt}});
  const int64_t resumed = conveyor::load_checkpoint("consumer.ckpt", pipe, {&opt});
  std::cout << "consumer: loss " << first << " -> " << last << ", conveyor::schedule registered: " << ops.has_value()
            << ", checkpoint resumes at step " << resumed << "\n";
  static_assert(CONVEYOR_VERSION_NUMBER >= 200, "the installed conveyor.h carries the version macros");
  std::cout << "consumer: built against conveyor " << CONVEYOR_VERSION << "\n";
  return (last < 0.5 * first && ops.has_value() && resumed == 30) ? 0 : 1;
}
