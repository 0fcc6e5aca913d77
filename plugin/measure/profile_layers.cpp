// profile_layers: each layer of a model timed on one micro-batch, forward
// and backward, as a stage runs it (plugin/measure/profile_model.h).
#include "plugin/measure/cpu_sharing.h"
#include "plugin/measure/device_timing.h"
#include "plugin/measure/in_order.h"
#include "plugin/measure/profile_model.h"
#include "plugin/measure/update_timing.h"

#include "plugin/core/errors.h"
#include "plugin/model/model_snapshot.h"
#include "plugin/model/stage.h"
#include "plugin/support/tensors.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace conveyor {

namespace {

using measure_detail::seconds_of;

int64_t floating_bytes(const Tensors& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.defined() && t.is_floating_point() ? tensor_bytes(t) : 0;
  return total;
}

// The first n samples of every tensor along dim (a tensor without that dim goes whole).
Tensors first_samples(const Tensors& batch, int64_t dim, int64_t n) {
  Tensors out;
  for (const auto& t : batch) out.push_back(t.defined() && t.dim() > dim ? t.narrow(dim, 0, n) : t);
  return out;
}

Tensors on_device(const Tensors& tensors, const c10::Device& device) {
  Tensors out;
  for (const auto& t : tensors) out.push_back(t.defined() ? t.to(device) : t);
  return out;
}

// The outputs that require grad, and a gradient of ones for each.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> roots_and_ones(const Tensors& outputs) {
  std::vector<at::Tensor> roots, grads;
  for (const auto& t : outputs) {
    if (t.defined() && t.requires_grad()) {
      roots.push_back(t);
      grads.push_back(at::ones_like(t));
    }
  }
  return {roots, grads};
}

void backward_from(const Tensors& outputs) {
  const auto [roots, grads] = roots_and_ones(outputs);
  if (!roots.empty()) torch::autograd::backward(roots, grads);
}

struct Times {
  double forward = 0, backward = 0;
  double input = 0, weight = 0;  // the split backward
};


// The split backward as the runtime runs it: I to the floating `inputs`
// (graph retained), then W from the outputs to `weights` only.
std::pair<double, double> split_backward(const c10::Device& device, const Tensors& outputs, const Tensors& inputs,
                                         const std::vector<at::Tensor>& weights) {
  const auto [roots, grads] = roots_and_ones(outputs);
  std::vector<at::Tensor> wanted;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) wanted.push_back(t);
  }
  if (roots.empty()) return {0.0, 0.0};
  const double i = wanted.empty() ? 0.0 : seconds_of(device, [&] {
    torch::autograd::grad(roots, wanted, grads, /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  });
  const double w = weights.empty() ? 0.0 : seconds_of(device, [&] {
    torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false, weights);
  });
  return {i, w};
}

// Median forward, backward and split backward times of `forward` after
// warm-up.
Times measure(const ProfileOptions& o, const c10::Device& device, const std::function<Tensors()>& forward,
              const Tensors& inputs, const std::vector<at::Tensor>& weights) {
  std::vector<double> fwd, bwd, in, wt;
  for (int r = 0; r < o.warmup() + o.repeats(); ++r) {
    Tensors y;
    const double f = seconds_of(device, [&] { y = forward(); });
    const double b = seconds_of(device, [&] { backward_from(y); });
    const auto [i, w] = split_backward(device, forward(), inputs, weights);
    if (r >= o.warmup()) fwd.push_back(f), bwd.push_back(b), in.push_back(i), wt.push_back(w);
  }
  return {median(fwd), median(bwd), median(in), median(wt)};
}

// Threads that keep the device busy with `work` while they live, as the
// other stages of a shared device would.
class CoRunners {
 public:
  CoRunners(int count, const std::function<void()>& work) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, work] {
        torch::NoGradGuard no_grad;
        while (!stop_.load()) work();
      });
    }
  }
  ~CoRunners() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

std::string layer_name(const std::string& index, const torch::nn::AnyModule& layer) {
  std::ostringstream os;
  os << index << " ";
  layer.ptr()->pretty_print(os);
  std::string name = os.str();
  if (name.size() > 80) name = name.substr(0, 77) + "...";
  return name;
}

// Every layer's time and bytes at one batch size; fills `profile` when `full`.
std::vector<Times> profile_at(const std::vector<std::shared_ptr<Stage>>& layers, const Tensors& inputs,
                              const Tensors& targets, const TensorsLossFn& loss_fn, const ProfileOptions& o,
                              const c10::Device& device, ModelProfile* profile, Times& loss) {
  std::vector<Times> times;
  Tensors x = inputs;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Tensors in = (i == 0 ? x : as_input_leaves(x));
    {
      CoRunners others(o.sharing_stages() - 1, [&] { layers[i]->forward(in); });
      std::vector<at::Tensor> weights;
      for (const auto& w : layers[i]->layer_parameters(0)) {
        if (w.requires_grad()) weights.push_back(w);
      }
      times.push_back(measure(o, device, [&] { return layers[i]->forward(in); }, in, weights));
    }
    {
      torch::NoGradGuard no_grad;
      x = layers[i]->forward(in);
    }
    if (profile) {
      LayerProfile& l = profile->layers[i];
      l.output_bytes = tensor_bytes(x);
      l.output_grad_bytes = floating_bytes(x);
    }
  }
  const Tensors out = as_input_leaves(x);
  std::vector<double> fwd, bwd;
  for (int r = 0; r < o.warmup() + o.repeats(); ++r) {
    at::Tensor value;
    const double f = seconds_of(device, [&] { value = loss_fn(out, targets); });
    const double b = seconds_of(device, [&] { value.backward(); });
    if (r >= o.warmup()) fwd.push_back(f), bwd.push_back(b);
  }
  loss = {median(fwd), median(bwd)};

  // As a stage runs them, in order, the layers load their weights after the
  // others': each forward as timed within the pass, the backwards scaled by
  // the whole backward over the sum of its parts timed alone.
  measure_detail::InOrderTimes in_order;
  {
    CoRunners others(o.sharing_stages() - 1, [&] {
      Tensors y = inputs;
      for (const auto& layer : layers) y = layer->forward(y);
    });
    in_order = measure_detail::time_in_order(layers, inputs, targets, loss_fn, device, o.warmup(), o.repeats());
  }
  double parts = loss.backward;
  for (const Times& t : times) parts += t.backward;
  const double scale = parts > 0 && in_order.backward > 0 ? in_order.backward / parts : 1.0;
  for (size_t i = 0; i < times.size(); ++i) {
    times[i].forward = in_order.forward[i];
    times[i].backward *= scale, times[i].input *= scale, times[i].weight *= scale;
  }
  loss.backward *= scale;
  return times;
}

}  // namespace

ModelProfile profile_layers(const torch::nn::Sequential& model, const Tensors& inputs, const Tensors& targets,
                           const TensorsLossFn& loss_fn, const ProfileOptions& o) {
  if (model->size() == 0) throw std::invalid_argument("conveyor: profile_model: the model has no layers");
  check_argument(o.repeats() >= 1 && o.warmup() >= 0 && o.sharing_stages() >= 1,
                 "conveyor: profile_model: repeats and sharing_stages must be positive and warmup non-negative, got ",
                 o.repeats(), ", ", o.sharing_stages(), " and ", o.warmup());
  int64_t batch = 0;
  for (const auto& t : inputs) {
    if (t.defined() && t.dim() > o.batch_dim()) {
      batch = t.size(o.batch_dim());
      break;
    }
  }
  check_argument(batch >= 1, "conveyor: profile_model: no input has samples along dimension ", o.batch_dim());
  const c10::Device device(o.device());
  const RestoredOnExit restore(model, /*weights=*/false);  // profiling changes no weight
  std::vector<std::shared_ptr<Stage>> layers;  // one single-layer stage each: the runtime's way of calling a layer
  ModelProfile profile;
  profile.device = device.str();
  profile.batch_size = batch;
  const auto children = model->named_children();
  int64_t index = 0;
  for (const auto& layer : *model) {
    const auto& named = children[index];
    layers.push_back(std::make_shared<Stage>(0, std::vector{std::pair{named.key(), layer}}, index, device));
    LayerProfile l;
    l.name = layer_name(named.key(), layer);
    for (const auto& p : layer.ptr()->parameters()) l.parameter_bytes += p.requires_grad() ? tensor_bytes(p) : 0;
    measure_detail::time_updates(layer, o, device, l);
    profile.layers.push_back(std::move(l));
    ++index;
  }
  const Tensors in = on_device(inputs, device), tgt = on_device(targets, device);
  profile.input_bytes = tensor_bytes(in);
  Times loss;
  const std::vector<Times> full = profile_at(layers, in, tgt, loss_fn, o, device, &profile, loss);
  profile.loss_forward_seconds = loss.forward;
  profile.loss_backward_seconds = loss.backward;
  const int64_t half = batch / 2;
  if (o.two_sizes() && half >= 1) {
    Times half_loss;
    const std::vector<Times> part = profile_at(layers, first_samples(in, o.batch_dim(), half),
                                               first_samples(tgt, o.batch_dim(), half), loss_fn, o, device, nullptr,
                                               half_loss);
    // t(n) = fixed + slope * n through both sizes, the fixed part kept within [0, t(batch)].
    const auto fixed = [&](double at_full, double at_half) {
      const double slope = (at_full - at_half) / static_cast<double>(batch - half);
      return std::clamp(at_full - slope * static_cast<double>(batch), 0.0, at_full);
    };
    for (size_t i = 0; i < full.size(); ++i) {
      LayerProfile& l = profile.layers[i];
      l.forward_fixed = fixed(full[i].forward, part[i].forward);
      l.backward_fixed = fixed(full[i].backward, part[i].backward);
    }
  }
  for (size_t i = 0; i < full.size(); ++i) {
    profile.layers[i].forward_seconds = full[i].forward;
    profile.layers[i].backward_seconds = full[i].backward;
    profile.layers[i].input_backward_seconds = full[i].input;
    profile.layers[i].weight_backward_seconds = full[i].weight;
  }
  const c10::Device next = o.next_device().empty() ? device : c10::Device(o.next_device());
  profile.link = measure_link(device, next);
  if (!device.is_cpu()) profile.host_link = measure_link(device, c10::Device(c10::kCPU));
  if (device.is_cpu() && o.count_cores()) {
    profile.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    profile.slowdown = measure_detail::measure_slowdown([&] { measure_detail::whole_step(layers, in, tgt, loss_fn); },
                                                        profile.cores + 2, o.repeats());
    // n threads on fewer cores take at least n / cores as long: a lower
    // measurement is a moment when something else slowed the one alone.
    for (size_t n = profile.cores + 1; n <= profile.slowdown.size(); ++n) {
      profile.slowdown[n - 1] = std::max(profile.slowdown[n - 1], static_cast<double>(n) / profile.cores);
    }
  }
  return profile;
}

}  // namespace conveyor
