// What happens between a training step's last action and the next step:
// a synchronous step's update (its gradients reduced across replicas, the
// loss scaler's verdict, unscaling, clipping by global norm, the optimizers'
// steps), an asynchronous step's verdict on its loss scale, and the global
// norm that clipping and Pipeline::clip_grad_norm compute.
#include "ops/nonfinite/nonfinite.h"
#include "plugin/core/errors.h"
#include "plugin/model/sharded_state.h"
#include "plugin/runtime/runtime.h"
#include "plugin/runtime/step_context.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <set>
#include <utility>

namespace conveyor {

namespace {

bool any_nonfinite(const std::vector<at::Tensor>& tensors) {
  return !tensors.empty() && count_nonfinite(tensors).item<int64_t>() > 0;
}

// Whether `local` is true on any worker of the pipeline (and on any replica,
// where each holds a shard of the gradients).
bool on_any_worker(Transport& transport, const ReplicaReduction& replicas, bool local) {
  at::Tensor flag = at::full({1}, local ? 1.0 : 0.0, at::kDouble);
  transport.reduce_over_workers(flag, /*max=*/true);
  if (replicas.across_replicas) replicas.across_replicas(flag, /*max=*/true);
  return flag.item<double>() > 0;
}

}  // namespace

at::Tensor Runtime::local_norm_part(double norm_type, std::vector<at::Tensor>& grads) const {
  // A tied parameter's copies hold the same (summed) gradient: the first
  // holder's counts, as the unsplit model's one tensor would.
  std::set<std::pair<int, size_t>> later_copies;
  for (const TiedParameter& tie : ties_) {
    for (size_t i = 1; i < tie.size(); ++i) later_copies.insert(tie[i]);
  }
  const bool inf = std::isinf(norm_type);
  std::vector<at::Tensor> norms;
  for (int k : local_) {
    const auto& holders = stages_[k]->gradient_holders();  // one per live weight, in order
    for (size_t i = 0; i < holders.size(); ++i) {
      const at::Tensor& g = holders[i].grad();
      if (!g.defined()) continue;
      grads.push_back(g);
      if (later_copies.count({k, i})) continue;
      // Per tensor, as torch::nn::utils::clip_grad_norm_ computes it.
      norms.push_back((inf ? g.abs().max() : g.norm(norm_type)).to(c10::kCPU));
    }
  }
  if (norms.empty()) return at::empty({0}, at::kDouble);
  const auto dtype = norms[0].scalar_type();
  for (auto& n : norms) {
    if (n.scalar_type() != dtype) {  // stages of different dtypes: compare in double
      for (auto& m : norms) m = m.to(at::kDouble);
      break;
    }
  }
  return at::stack(norms);
}

double Runtime::clip_grad_norm(double max_norm, double norm_type) {
  check_argument(max_norm > 0 && std::isfinite(max_norm), "conveyor: clipping needs a positive finite max_norm, got ",
                 max_norm);
  check_argument(norm_type > 0 && !std::isnan(norm_type), "conveyor: clipping's norm_type must be positive (2, any ",
                 "p > 0, or infinity), got ", norm_type);
  c10::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  std::vector<at::Tensor> grads;
  const at::Tensor norms = local_norm_part(norm_type, grads);
  at::Tensor total;
  const auto& across_replicas = replicas_.across_replicas;  // set: each replica holds a shard
  if (local_.size() == stages_.size() && !across_replicas) {
    // Every stage is here: the norm of the per-tensor norms, as the unsplit
    // model's clip_grad_norm_ computes it, bit for bit.
    if (norms.numel() == 0) return 0.0;
    total = norms.numel() == 1 ? norms[0] : inf ? norms.max() : norms.norm(norm_type);
  } else {
    // Each process's part, reduced over the pipeline's processes (and the
    // replicas' shards).
    at::Tensor part = at::zeros({1}, at::kDouble);
    if (norms.numel() > 0) {
      part = (inf ? norms.max() : norms.to(at::kDouble).pow(norm_type).sum()).to(at::kDouble).reshape({1});
    }
    transport_->reduce_over_workers(part, /*max=*/inf);
    if (across_replicas) across_replicas(part, /*max=*/inf);
    total = inf ? part[0] : part[0].pow(1.0 / norm_type);
  }
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.device()));
  return total.item<double>();
}

void Runtime::run_sharding(const schedules::ShardAction& action, StepContext& ctx) {
  const int k = action.stage;
  if (action.kind != schedules::ShardKind::kReduceGrad) {
    // UNSHARD and RESHARD, for a stage whose replicas shard its parameters
    // (elsewhere its parameters are whole: nothing to do). In inference and
    // steps that accumulate too: the forwards and backwards need them.
    if (ShardedState* shards = stages_[k]->parameter_shards()) {
      if (action.kind == schedules::ShardKind::kUnshard) {
        shards->gather_parameters();
      } else {
        shards->release_parameters();
      }
    }
    return;
  }
  auto& st = ctx.stages[k];
  // build_schedule allows a second only where the reduction accumulates, and
  // then the backward between them waited for the first (run_worker).
  TORCH_INTERNAL_ASSERT(!st.reducing, "conveyor: ", action.str(), " with the last one still pending");
  // Nothing to reduce: inference, a step that accumulates, no replicas, or a
  // caller's optimizer (the distributed pipeline reduces its gradients after
  // the step). A tied parameter's stage has no REDUCE_GRAD (StageRunner).
  if (!ctx.training() || !ctx.data.update || !replicas_ || !stages_[k]->optimizer()) return;
  Stage& stage = *stages_[k];
  // The guard checks what the reduction reads (it may release them) before
  // it starts: a replica's non-finite gradient never reaches its peers.
  if (guard_) {
    check_finite(k, -1, "gradient", stage.made_gradients(), ctx, "");
    st.checked = true;
  }
  st.reducing = replicas_.start(k, stage.live(), stage.gradient_holders());
}

void Runtime::gather_unscheduled(const schedules::Schedule& schedule) {
  std::set<int> gathered;
  for (const auto& line : schedule.sharding) {
    for (const auto& placed : line) {
      if (placed.action.kind == schedules::ShardKind::kUnshard) gathered.insert(placed.action.stage);
    }
  }
  for (int k : local_) {
    ShardedState* shards = stages_[k]->parameter_shards();
    if (shards && !gathered.count(k)) shards->gather_parameters();
  }
}

void Runtime::release_sharded_parameters() {
  for (ShardedState* shards : local_parameter_shards(*this)) shards->release_parameters();
}

void Runtime::update(StepContext& ctx, StepResult& result) {
  result.loss_scale = scaler_ ? scaler_->scale() : 1.0;
  if (!ctx.schedule.synchronous()) {
    // The step updated as it went (optimizer_step): what remains is the
    // scaler's verdict on the whole step, the same on every worker.
    for (int k : local_) {
      result.skipped_updates += ctx.stages[k].skipped;
      result.grad_norm = std::fmax(result.grad_norm, ctx.stages[k].grad_norm);  // NaN: not clipped
    }
    if (scaler_) scaler_->update(on_any_worker(*transport_, replicas_, result.skipped_updates > 0));
    return;
  }
  std::vector<int> owned;  // stages with the pipeline's own optimizer
  for (int k : local_) {
    if (stages_[k]->optimizer()) owned.push_back(k);
  }
  if (owned.empty() || !ctx.data.update) return;
  if (replicas_) {
    for (int k : owned) {
      // Started at the stage's REDUCE_GRAD, or now.
      if (auto& reducing = ctx.stages[k].reducing) {
        std::exchange(reducing, nullptr)();
      } else {
        replicas_.gradients(k, stages_[k]->live(), stages_[k]->gradient_holders());
      }
    }
  }
  if (scaler_) {
    std::vector<at::Tensor> grads;
    for (int k : owned) {
      for (auto& g : stages_[k]->gradients()) grads.push_back(g);
    }
    if (on_any_worker(*transport_, replicas_, any_nonfinite(grads))) {
      // An overflow anywhere: no stage steps, on any process or replica.
      for (int k : owned) {
        stages_[k]->skip_step();
        ++ctx.stages[k].updates;
      }
      result.skipped_updates = 1;
      scaler_->update(true);
      return;
    }
    c10::NoGradGuard no_grad;
    const double inverse = 1.0 / scaler_->scale();
    for (auto& g : grads) g.mul_(inverse);
  }
  if (training_.clip_grad_value > 0) {
    for (int k : owned) torch::nn::utils::clip_grad_value_(stages_[k]->gradient_holders(), training_.clip_grad_value);
  }
  if (training_.clip_grad_norm > 0) {
    result.grad_norm = clip_grad_norm(training_.clip_grad_norm, training_.clip_norm_type);
  }
  for (int k : owned) optimizer_step(k, -1, ctx);
  result.stepped = true;
  if (scaler_) scaler_->update(false);
}

}  // namespace conveyor
