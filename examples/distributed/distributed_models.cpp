#include "examples/distributed/distributed_models.h"

#include "examples/common/lm_model.h"
#include "plugin/measure/c10d_link.h"
#include "plugin/measure/profile_model.h"

#include <torch/torch.h>

#include <iostream>
#include <stdexcept>

namespace conveyor::examples {

torch::nn::Sequential make_model(const DistributedModel& m) {
  torch::manual_seed(m.seed);
  if (m.kind == "lm") return make_language_model(m.vocab, m.embed, m.hidden, 0.0).layers;
  if (m.kind != "mlp") throw std::invalid_argument("--model must be mlp or lm, got '" + m.kind + "'");
  torch::nn::Sequential model;
  int width = m.inputs;
  // He initialisation: LibTorch's default shrinks a deep ReLU stack's signal
  // until nothing learns in a short run.
  const auto linear = [](int in, int out) {
    torch::nn::Linear layer(in, out);
    torch::nn::init::kaiming_normal_(layer->weight, 0.0, torch::kFanIn, torch::kReLU);
    torch::nn::init::zeros_(layer->bias);
    return layer;
  };
  for (int i = 0; i < m.layers; ++i) {
    model->push_back(linear(width, m.hidden));
    model->push_back(torch::nn::ReLU());
    width = m.hidden;
  }
  model->push_back(linear(width, m.classes));
  return model;
}

Batch global_batch(const DistributedModel& m, int64_t step) {
  if (m.kind == "lm") {
    // Each target is a fixed function of its token: learnable, and the same in Python.
    torch::manual_seed(m.seed + step);
    const at::Tensor x = torch::randint(m.vocab, {m.batch, m.length});
    return {x, (x * 7 + 3).remainder(m.vocab)};
  }
  torch::manual_seed(m.seed + 7919);
  const at::Tensor teacher = torch::randn({m.inputs, m.classes});
  torch::manual_seed(m.seed + step);
  const at::Tensor x = torch::randn({m.batch, m.inputs});
  return {x, x.matmul(teacher).argmax(1)};
}

at::Tensor cross_entropy(const at::Tensor& out, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), target.reshape({-1}));
}

void evaluate(const DistributedModel& m, torch::nn::Sequential model) {
  torch::NoGradGuard no_grad;
  model->eval();
  const Batch held_out = global_batch(m, -1);
  const at::Tensor out = model->forward(held_out.x);
  const double accuracy = out.argmax(-1).eq(held_out.y).to(at::kDouble).mean().item<double>();
  std::cout << "eval: loss " << cross_entropy(out, held_out.y).item<double>() << ", accuracy " << accuracy << "\n";
}

Prediction predict_c10d_step(const DistributedModel& m, const PipelineOptions& options, bool shared_memory) {
  const Batch b = global_batch(m, 0);
  ModelProfile profile =
      profile_first_microbatch(make_model(m), b.x, b.y, cross_entropy, options, ProfileOptions().count_cores(true));
  profile.link = measure_c10d_link(4 << 20, 9, std::chrono::seconds(30), shared_memory);
  const auto plan_of = [&](const ModelProfile& p) {
    return predict_step(make_model(m), PipelineOptions(options).profile(std::make_shared<ModelProfile>(p)), m.batch);
  };
  ModelProfile without = profile;
  without.link.cpu_seconds_per_transfer = 0;
  std::cout << "c10d link: " << profile.link.latency_seconds * 1e6 << " us latency, "
            << profile.link.cpu_seconds_per_transfer * 1e6 << " us of CPU a transfer; " << profile.cores
            << " cores; predicted without the transfers' CPU time: " << plan_of(without).step_seconds() * 1e3
            << " ms\n";
  return plan_of(profile);
}

}  // namespace conveyor::examples
