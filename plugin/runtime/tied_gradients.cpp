// Tied parameters (see TiedParameter in runtime.h): the copies start equal
// (unify_tied_values, once; refresh_tied_copies before each run where the
// caller steps them), and after a step's backwards every copy's
// gradient is the sum over the holders, across processes through the
// transport. Only run() calls these, around the workers.
#include "plugin/runtime/runtime.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace conveyor {

namespace {

// The distinct stages that hold a tied parameter, ascending, and whether
// this process runs any or all of them.
struct TieHolders {
  std::vector<int> stages;
  bool any_local = false, all_local = true;
};

TieHolders holders_of(const TiedParameter& tie, const Runtime& runtime) {
  TieHolders h;
  for (const auto& [k, i] : tie) {
    if (h.stages.empty() || h.stages.back() != k) h.stages.push_back(k);
    if (runtime.is_local(k)) {
      h.any_local = true;
    } else {
      h.all_local = false;
    }
  }
  return h;
}

}  // namespace

void Runtime::unify_tied_values() {
  c10::NoGradGuard no_grad;
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedParameter& tie = ties_[t];
    const TieHolders h = holders_of(tie, *this);
    if (!h.any_local) continue;
    at::Tensor value;  // the first holder's
    if (h.all_local) {
      value = stages_[tie.front().first]->live()[tie.front().second];
    } else {
      for (const auto& [k, i] : tie) {
        if (!is_local(k)) continue;
        value = transport_->first_holders_value(static_cast<int>(t), h.stages, stages_[k]->live()[i]);
        break;
      }
    }
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      const at::Tensor& w = stages_[k]->live()[i];
      if (!w.is_same(value)) w.copy_(value);
    }
  }
}

void Runtime::refresh_tied_copies() {
  c10::NoGradGuard no_grad;
  for (const TiedParameter& tie : ties_) {
    const auto& [first, index] = tie.front();
    if (!is_local(first) || stages_[first]->optimizer()) continue;
    const at::Tensor& value = stages_[first]->live()[index];
    for (const auto& [k, i] : tie) {
      const at::Tensor& w = is_local(k) ? stages_[k]->live()[i] : value;
      if (!w.is_same(value)) w.copy_(value);
    }
  }
}

std::vector<Tensors> Runtime::take_tied_gradients() {
  std::vector<Tensors> before(ties_.size());
  for (size_t t = 0; t < ties_.size(); ++t) {
    for (const auto& [k, i] : ties_[t]) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      before[t].push_back(w.grad());
      w.mutable_grad() = at::Tensor();
    }
  }
  return before;
}

void Runtime::add_back_tied_gradients(const std::vector<Tensors>& before) {
  for (size_t t = 0; t < ties_.size(); ++t) {
    size_t n = 0;
    for (const auto& [k, i] : ties_[t]) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      const at::Tensor& held = before[t][n++];
      if (held.defined()) w.mutable_grad() = w.grad().defined() ? held + w.grad() : held;
    }
  }
}

void Runtime::sum_tied_gradients(const std::vector<Tensors>& before) {
  for (size_t t = 0; t < ties_.size(); ++t) {
    const TiedParameter& tie = ties_[t];
    const TieHolders h = holders_of(tie, *this);
    if (!h.any_local) continue;
    at::Tensor sum;  // the local holders' gradients of this step, in stage order
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      const at::Tensor& w = stages_[k]->live()[i];
      const at::Tensor g = w.grad().defined() ? w.grad() : at::zeros_like(w);
      sum = sum.defined() ? sum + g.to(sum.device()) : g.clone();
    }
    if (!h.all_local) sum = transport_->sum_over_holders(static_cast<int>(t), h.stages, sum);
    size_t n = 0;
    for (const auto& [k, i] : tie) {
      if (!is_local(k)) continue;
      at::Tensor w = stages_[k]->live()[i];
      const at::Tensor& held = before[t][n++];
      const at::Tensor mine = sum.to(w.device(), /*non_blocking=*/false, /*copy=*/true);
      w.mutable_grad() = held.defined() ? held + mine : mine;
    }
  }
}

}  // namespace conveyor
