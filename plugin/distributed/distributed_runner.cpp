#include "plugin/distributed/distributed_runner.h"

#include "plugin/distributed/sharded_optimizer.h"
#include "plugin/core/errors.h"
#include "plugin/model/stage.h"
#include "plugin/planner/partition.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <limits>
#include <stdexcept>

namespace conveyor {

namespace {

// Tags of gather_model() on the pipeline group, above any micro-batch's.
constexpr int kGatherTag = 1 << 30;

// The stage's weights' gradients, averaged (or summed) across its replicas. A
// weight with no gradient on this replica contributes zeros and receives the
// reduced gradient, as if it had one.
PendingCollective start_reducing_gradients(ProcessGroups& groups, int stage, const std::vector<at::Tensor>& weights,
                                           bool average) {
  if (groups.layout().replicas == 1) return [] {};
  std::vector<at::Tensor> grads;
  bool on_device = false;
  for (const auto& w : weights) {
    if (!w.requires_grad()) continue;
    if (!w.grad().defined()) w.mutable_grad() = at::zeros_like(w);
    grads.push_back(w.grad());
    on_device = on_device || w.device().is_cuda();
  }
  const auto& group = on_device && groups.replicas_device() ? groups.replicas_device() : groups.replicas();
  return start_all_reduce(groups, *group, grads, average,
                          c10::str(average ? "averaging" : "summing", " the gradients of stage ", stage,
                                   " across its ", groups.layout().replicas, " replicas (",
                                   ranks_text(groups.layout().replica_ranks(groups.worker())), ")"));
}

std::string local_device(const PipelineOptions& options, int stage, int local_rank) {
  const auto& names = options.devices();
  if (names.empty()) return "cpu";
  std::string name = names.size() == 1 ? names[0] : names.at(static_cast<size_t>(stage));
  if (name == "cuda") name = c10::str(name, ":", local_rank);
  return name;
}

}  // namespace

at::Tensor shard(const at::Tensor& batch, int replica, int replicas, int64_t dim) {
  check_argument(batch.defined(), "conveyor: shard() of an undefined batch");
  check_argument(replicas >= 1 && replica >= 0 && replica < replicas, "conveyor: shard(): replica ", replica,
                 " is not one of ", replicas);
  check_argument(dim >= 0 && dim < batch.dim(), "conveyor: shard(): the batch has shape ", batch.sizes(),
                 ", which has no dimension ", dim);
  const int64_t n = batch.size(dim);
  check_argument(n % replicas == 0, "conveyor: shard(): a global batch of ", n, " samples (dimension ", dim,
                 " of shape ", batch.sizes(), ") does not split evenly among ", replicas, " replicas; use a multiple of ",
                 replicas);
  const int64_t each = n / replicas;
  return batch.narrow(dim, replica * each, each);
}

DistributedRunner::DistributedRunner(torch::nn::Sequential model, PipelineOptions options,
                                     std::shared_ptr<ProcessGroups> groups)
    : DistributedRunner(std::move(model), (check_option_values(options), std::move(options)), std::move(groups),
                        OptionValuesChecked{}) {}

DistributedRunner::DistributedRunner(torch::nn::Sequential model, PipelineOptions options,
                                     std::shared_ptr<ProcessGroups> groups, OptionValuesChecked)
    : model_(model), groups_(std::move(groups)), distributed_(options.distributed()) {
  if (!groups_) throw std::invalid_argument("conveyor: DistributedRunner needs process groups");
  const HybridLayout& layout = groups_->layout();
  if (options.workers() == 0) options.workers(layout.workers);
  check_argument(options.workers() == layout.workers, "conveyor: the options ask for ", options.workers(),
                 " workers, but the process groups hold replicas of a ", layout.workers, "-worker pipeline");
  const int k = groups_->worker();
  const std::string device = local_device(options, k, distributed_.local_rank);
  options.devices({device});  // the other workers' devices belong to other processes
  average_ = options.loss_reduction() == LossReduction::kMean;
  const double lr_scale = distributed_.scale_learning_rate ? layout.replicas : 1.0;
  const ShardLevel level = layout.replicas > 1 ? distributed_.shard : ShardLevel::kNone;
  const bool sharded = level >= ShardLevel::kOptimizer;
  check_argument(!sharded || options.optimizer(), "conveyor: sharded optimizer state needs the pipeline's own ",
                 "optimizer (PipelineOptions::optimizer): a caller's optimizer holds the whole state");
  if (lr_scale != 1.0) {
    // The global batch's learning rate: the optimizer's own and the schedule's, scaled.
    if (options.optimizer()) {
      set_optimizer_factory(options, [inner = optimizer_factory(options), lr_scale](std::vector<at::Tensor> weights) {
        std::unique_ptr<torch::optim::Optimizer> optimizer = inner(std::move(weights));
        for (auto& group : optimizer->param_groups()) group.options().set_lr(group.options().get_lr() * lr_scale);
        return optimizer;
      });
    }
    if (options.lr_schedule()) {
      options.lr_schedule([inner = options.lr_schedule(), lr_scale](int64_t n) { return inner(n) * lr_scale; });
    }
  }
  ReplicaReduction replicas;
  if (sharded) {
    set_optimizer_factory(options, [inner = optimizer_factory(options), groups = groups_, level](
                                       std::vector<at::Tensor> weights) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<ShardedOptimizer>(std::move(weights), inner, groups, level);
    });
    replicas.start = [groups = groups_, average = average_, level](int stage, const std::vector<at::Tensor>& weights,
                                                                   const std::vector<at::Tensor>& holders) {
      return level >= ShardLevel::kGradients
                 ? start_reduce_scatter_into_pieces(*groups, stage, weights, holders, average)
                 : start_reduce_scatter_gradients(*groups, stage, weights, average);
    };
    replicas.accumulates = level >= ShardLevel::kGradients;
    replicas.across_replicas = [groups = groups_](at::Tensor& values, bool max) {
      all_reduce_values(*groups, *groups->replicas(), values, max,
                        c10::str("the verdict or gradient norm of stage ", groups->worker(), "'s replicas"));
    };
  }
  // The pipeline's own optimizer updates from the replicas' reduced gradients.
  if (!sharded && options.optimizer() && layout.replicas > 1) {
    replicas.start = [groups = groups_, average = average_](int stage, const std::vector<at::Tensor>& weights,
                                                            const std::vector<at::Tensor>&) {
      return start_reducing_gradients(*groups, stage, weights, average);
    };
  }

  C10dTransportOptions transport_options;
  transport_options.worker = k;
  transport_options.device = worker_devices({device}, 1).at(0);
  transport_options.ranks = layout.pipeline_ranks(groups_->replica());
  transport_options.timeout = options.timeout();
  transport_options.activation_shapes = distributed_.activation_shapes;
  transport_options.shared_memory = distributed_.shared_memory;
  const c10::intrusive_ptr<c10d::Backend> device_group =
      transport_options.device.is_cuda() ? groups_->pipeline_device() : c10::intrusive_ptr<c10d::Backend>();
  auto transport = std::make_unique<C10dTransport>(groups_->pipeline(), device_group, transport_options);
  transport_ = transport.get();
  runner_ = std::make_unique<StageRunner>(model, std::move(options), k, std::move(transport), std::move(replicas));
  check_argument(!sharded || runner_->schedule().synchronous(), "conveyor: sharded optimizer state needs a ",
                 "synchronous schedule; '", runner_->schedule().name, "' steps each stage after every micro-batch");

  // Identical initial weights: replica 0's, stage by stage.
  const bool on_device = transport_options.device.is_cuda() && groups_->replicas_device();
  for (int s = 0; s < runner_->num_stages(); ++s) {
    if (!runner_->is_local(s)) continue;
    const Stage& stage = runner_->stage(s);
    std::vector<at::Tensor> tensors = stage.live();
    for (const auto& b : stage.module()->buffers()) tensors.push_back(b);
    broadcast(*groups_, on_device ? *groups_->replicas_device() : *groups_->replicas(), tensors, 0,
              c10::str("broadcasting the initial weights of stage ", s, " from replica 0"));
    // Equal now: with the parameters sharded, each replica keeps its pieces.
    if (ShardedState* shards = stage.parameter_shards()) shards->shard_parameters();
  }
}

void DistributedRunner::unshard() {
  for (ShardedState* shards : local_parameter_shards(*runner_)) shards->gather_parameters();
}

void DistributedRunner::reshard() {
  for (ShardedState* shards : local_parameter_shards(*runner_)) shards->release_parameters();
}

int64_t DistributedRunner::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (int s = 0; s < runner_->num_stages(); ++s) {
    if (!runner_->is_local(s)) continue;
    if (const torch::optim::Optimizer* optimizer = runner_->stage(s).optimizer()) {
      bytes += conveyor::optimizer_state_bytes(*optimizer);
    }
  }
  return bytes;
}

double DistributedRunner::clip_grad_norm(double max_norm, double norm_type) {
  try {
    return runner_->clip_grad_norm(max_norm, norm_type);
  } catch (const std::invalid_argument&) {
    throw;
  } catch (...) {
    groups_->mark_failed();
    throw;
  }
}

double DistributedRunner::learning_rate(double base) const {
  return distributed_.scale_learning_rate ? base * groups_->layout().replicas : base;
}

StepResult DistributedRunner::train_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn) {
  return finish_step([&] { return runner_->train_step(input, target, loss_fn); });
}

StepResult DistributedRunner::train_step(const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn) {
  return finish_step([&] { return runner_->train_step(inputs, targets, loss_fn); });
}

StepResult DistributedRunner::train_microbatches(const std::vector<Tensors>& inputs,
                                                  const std::vector<Tensors>& targets, const TensorsLossFn& loss_fn) {
  return finish_step([&] { return runner_->train_microbatches(inputs, targets, loss_fn); });
}

StepResult DistributedRunner::finish_step(const std::function<StepResult()>& step) {
  StepResult result;
  try {
    result = step();
  } catch (...) {
    // Whatever failed, the peers are mid-step: this job cannot go on.
    groups_->mark_failed();
    throw;
  }
  const HybridLayout& layout = groups_->layout();
  // A caller's optimizer: every local stage's gradients at once, after the step.
  if (!runner_->options().optimizer()) start_reducing_gradients(*groups_, groups_->worker(), parameters(), average_)();
  // The global loss: each replica's comes from its last stage.
  const bool last = runner_->is_local(runner_->num_stages() - 1);  // not the last worker in a V shape
  at::Tensor loss = at::full({1}, last ? result.loss : 0.0, at::kDouble);
  all_reduce_everywhere(*groups_, {loss}, c10::str("reducing the loss of step ", runner_->completed_steps()));
  result.loss = loss.item<double>() / (average_ ? layout.replicas : 1);
  return result;
}

at::Tensor DistributedRunner::forward(const at::Tensor& input) {
  try {
    return runner_->forward(input);
  } catch (...) {
    groups_->mark_failed();
    throw;
  }
}

Tensors DistributedRunner::forward(const Tensors& inputs) {
  try {
    return runner_->forward(inputs);
  } catch (...) {
    groups_->mark_failed();
    throw;
  }
}

std::vector<at::Tensor> DistributedRunner::stage_tensors(int stage) const {
  const StageSpec& spec = runner_->split().stages.at(stage);
  std::vector<at::Tensor> tensors;
  for (int64_t i = spec.begin; i < spec.end; ++i) {
    const auto layer = weights_and_buffers(*model_->ptr(static_cast<size_t>(i)));
    tensors.insert(tensors.end(), layer.begin(), layer.end());
  }
  return tensors;
}

void DistributedRunner::gather_model() {
  // With the parameters sharded every replica gathers its stages' first; the
  // logging rank's stages (the model's own layers) stay whole until its next step.
  unshard();
  if (groups_->replica() != 0 || groups_->layout().workers == 1) {
    if (!is_logging_rank()) reshard();
    return;
  }
  c10d::Backend& group = *groups_->pipeline();
  const int me = groups_->worker();
  const schedules::Schedule& schedule = runner_->schedule();
  c10::NoGradGuard no_grad;
  // Stage by stage, each tensor on a tag of its own.
  for (int s = 0, tag = kGatherTag; s < runner_->num_stages(); ++s) {
    const int owner = schedule.worker_of(s);
    const std::vector<at::Tensor> tensors = stage_tensors(s);
    if (owner == 0 || (me != 0 && me != owner)) {
      tag += static_cast<int>(tensors.size());
      continue;
    }
    if (me == owner) {
      std::vector<c10::intrusive_ptr<c10d::Work>> sends;
      std::vector<std::vector<at::Tensor>> buffers;
      for (const auto& t : tensors) {
        buffers.push_back({t.detach().to(c10::kCPU).contiguous()});
        sends.push_back(group.send(buffers.back(), 0, tag++));
      }
      for (const auto& work : sends)
        wait(*groups_, work, c10::str("sending the weights of stage ", s, " to rank 0"));
      continue;
    }
    for (const auto& t : tensors) {
      std::vector<at::Tensor> buffer{at::empty_like(t, at::TensorOptions().device(c10::kCPU)).contiguous()};
      wait(*groups_, group.recv(buffer, owner, tag++),
           c10::str("receiving the weights of stage ", s, " from ",
                    groups_->describe(groups_->layout().rank_of(0, owner))));
      t.detach().copy_(buffer[0]);
    }
  }
  if (!is_logging_rank()) reshard();  // after sending them
}

}  // namespace conveyor
