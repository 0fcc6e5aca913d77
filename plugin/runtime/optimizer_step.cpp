// What decides whether weights change: the divergence guard's check of a
// loss or of gradients, and a stage's optimizer step, the only place where
// the runtime steps an optimizer (after each backward for schedules that
// step per micro-batch, once after the step for synchronous ones, whose
// update.cpp reduces, unscales and clips first). A schedule that steps per
// micro-batch does all of that here, per update: its gradients reduced
// across replicas, the loss scaler's verdict (a skipped update is an update
// by zero), unscaling and clipping by the stage's own norm.
#include "ops/nonfinite/nonfinite.h"
#include "plugin/core/errors.h"
#include "plugin/runtime/runtime.h"
#include "plugin/runtime/step_context.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>

namespace conveyor {

using schedules::Action;
using schedules::ActionKind;

void Runtime::optimizer_step(int k, int mb, StepContext& ctx) {
  Stage& stage = *stages_[k];
  auto& st = ctx.stages[k];
  if (mb >= 0) {
    // After micro-batch mb's backward: its gradients alone, checked first.
    stage.collect_gradients();
    TORCH_CHECK(stage.optimizer(), "schedule '", ctx.schedule.name, "' steps the optimizer after every micro-batch, ",
                "but the pipeline has none (PipelineOptions::optimizer)");
    if (replicas_) replicas_.gradients(k, stage.live(), stage.gradient_holders());
    if (guard_) {
      check_finite(k, mb, "gradient", stage.gradients(), ctx, Action{k, ActionKind::kBackward, mb}.str());
    }
    if (scaler_) {
      const std::vector<at::Tensor> grads = stage.gradients();
      if (!grads.empty() && count_nonfinite(grads).item<int64_t>() > 0) {
        stage.skip_step();
        ++st.updates;
        ++st.skipped;
        st.versions.after_update(st.updates, stage);
        return;
      }
      c10::NoGradGuard no_grad;
      const double inverse = 1.0 / scaler_->scale();
      for (const auto& g : grads) g.mul_(inverse);
    }
    if (training_.clip_grad_value > 0) torch::nn::utils::clip_grad_value_(stage.live(), training_.clip_grad_value);
    if (training_.clip_grad_norm > 0) {
      st.grad_norm = std::fmax(st.grad_norm, torch::nn::utils::clip_grad_norm_(stage.live(), training_.clip_grad_norm,
                                                                               training_.clip_norm_type));
    }
  }
  stage.step(training_.lr_schedule ? training_.lr_schedule(stage.updates()) : -1.0);
  ++st.updates;
  if (mb >= 0) st.versions.after_update(st.updates, stage);
}

void Runtime::check_finite(int k, int mb, const char* what, const std::vector<at::Tensor>& tensors,
                           const StepContext& ctx, const std::string& action) const {
  if (tensors.empty()) return;
  const int64_t bad = count_nonfinite(tensors).item<int64_t>();
  if (bad == 0) return;
  const int64_t step = completed_steps_ + 1;
  const std::string& schedule = ctx.schedule.name;
  const std::string where = action.empty() ? "" : c10::str(" in ", action, " (micro-batch ", mb, ")");
  throw DivergenceError(step, schedule, k, mb, action,
                        c10::str("conveyor: training diverged at step ", step, " of schedule '", schedule, "': stage ",
                                 k, " has a non-finite ", what, " (", bad, " element", bad == 1 ? "" : "s", ")", where,
                                 "; the weights of the last good step are kept"));
}

}  // namespace conveyor
