#include "plugin/distributed/data_parallel.h"

#include "plugin/core/errors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
// LibTorch's DataParallel header reaches into c10/cuda, which a CPU-only
// LibTorch (the torch 2.13.0+cpu wheel) does not ship.
#if __has_include(<c10/cuda/impl/cuda_cmake_macros.h>)
#include <torch/nn/parallel/data_parallel.h>
#define CONVEYOR_HAS_DATA_PARALLEL 1
#endif

#include <stdexcept>

namespace conveyor {

AllReduceDataParallel::AllReduceDataParallel(torch::nn::Sequential model,
                                             std::unique_ptr<torch::optim::Optimizer> optimizer,
                                             std::shared_ptr<ProcessGroups> groups)
    : model_(std::move(model)), optimizer_(std::move(optimizer)), groups_(std::move(groups)) {
  check_argument(groups_ && optimizer_, "conveyor: AllReduceDataParallel needs groups and an optimizer");
  check_argument(groups_->layout().workers == 1, "conveyor: AllReduceDataParallel replicates the whole model: ",
                 "use a layout of one worker, not ", groups_->layout().workers);
  broadcast(*groups_, *groups_->replicas(), weights_and_buffers(*model_), 0,
            "broadcasting the initial weights from rank 0");
}

double AllReduceDataParallel::train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn) {
  optimizer_->zero_grad(true);
  const at::Tensor loss = loss_fn(model_->forward(input), target);
  loss.backward();
  // The gradients and the loss in one collective.
  std::vector<at::Tensor> tensors;
  for (const auto& w : model_->parameters()) {
    if (!w.requires_grad()) continue;
    if (!w.grad().defined()) w.mutable_grad() = at::zeros_like(w);
    tensors.push_back(w.grad());
  }
  at::Tensor global_loss = loss.detach().reshape({1}).to(tensors.empty() ? at::kDouble : tensors[0].scalar_type());
  tensors.push_back(global_loss);
  all_reduce(*groups_, *groups_->replicas(), tensors, true,
             c10::str("averaging the gradients across ", groups_->layout().world_size(), " ranks"));
  optimizer_->step();
  return global_loss.item<double>();
}

double data_parallel_step(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, const at::Tensor& input,
                          const at::Tensor& target, const LossFn& loss_fn, const std::vector<c10::Device>& devices) {
  TORCH_CHECK(!devices.empty(), "conveyor: data_parallel_step needs at least one device");
  optimizer.zero_grad(true);
#ifdef CONVEYOR_HAS_DATA_PARALLEL
  const at::Tensor out = torch::nn::parallel::data_parallel(model, input, devices, devices[0]);
#else
  for (const auto& d : devices) {
    if (!d.is_cpu()) throw std::invalid_argument("conveyor: this LibTorch has no CUDA: DataParallel over " + d.str());
  }
  const at::Tensor out = model->forward(input);  // what DataParallel does without CUDA
#endif
  const at::Tensor loss = loss_fn(out, target.to(out.device()));
  loss.backward();
  optimizer.step();
  return loss.item<double>();
}

}  // namespace conveyor
