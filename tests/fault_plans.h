#pragma once
// Faults injected into in-process steps (plugin/support/fault_injection.h): where a
// step goes wrong, drawn from a seed, and the injector that makes it so.
// Shared by the in-process fault tests and the soak.

#include "plugin/support/fault_injection.h"
#include "plugin/transport/transport.h"
#include "schedules/schedule.h"

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

namespace conveyor::testing {

enum class FaultKind { kNone, kThrow, kNan, kStall };

inline const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kThrow: return "throw";
    case FaultKind::kNan: return "nan";
    case FaultKind::kStall: return "stall";
    default: return "none";
  }
}

struct FaultPlan {
  FaultKind kind = FaultKind::kNone;
  int stage = -1;   // kThrow, kStall: the stage whose action goes wrong
  int action = -1;  // its index in that stage's action list
  int microbatch = -1;  // kNan: the micro-batch whose loss turns NaN
  std::chrono::milliseconds stall{0};
};

// A fault of `kind` at a point of `schedule` drawn from `rng`. A stall is put
// where a neighbour waits on the stalled stage (any action after stage 0, or
// a forward of stage 0): stage 0's backwards near the end of a step deliver
// nothing anyone waits for, so a stall there only makes the step slower.
inline FaultPlan draw_fault(FaultKind kind, const schedules::Schedule& schedule, std::mt19937& rng,
                            std::chrono::milliseconds stall = std::chrono::milliseconds(0)) {
  FaultPlan plan;
  plan.kind = kind;
  plan.stall = stall;
  if (kind == FaultKind::kNan) {
    plan.microbatch = static_cast<int>(rng() % schedule.num_microbatches);
    return plan;
  }
  while (true) {
    plan.stage = static_cast<int>(rng() % schedule.num_stages);
    const auto& actions = schedule.workers[plan.stage];
    plan.action = static_cast<int>(rng() % actions.size());
    if (kind != FaultKind::kStall || plan.stage > 0 || actions[plan.action].kind == schedules::ActionKind::kForward) {
      return plan;
    }
  }
}

// Carries out one plan per step: arm() before the step, disarm() after.
class PlannedFaults : public FaultInjector {
 public:
  void arm(const FaultPlan& plan) {
    plan_ = plan;
    for (auto& n : actions_) n = 0;
    fired_ = false;
  }
  void disarm() { plan_ = FaultPlan(); }
  bool fired() const { return fired_; }
  const FaultPlan& plan() const { return plan_; }

  void before_action(int stage, const schedules::Action& action) override {
    const int index = actions_.at(stage)++;
    if (stage != plan_.stage || index != plan_.action) return;
    if (plan_.kind == FaultKind::kThrow) {
      fired_ = true;
      throw std::runtime_error("injected fault in " + action.str());
    }
    if (plan_.kind == FaultKind::kStall) {
      fired_ = true;
      std::this_thread::sleep_for(plan_.stall);
    }
  }

  at::Tensor on_loss(int /*stage*/, int microbatch, const at::Tensor& loss) override {
    if (plan_.kind != FaultKind::kNan || microbatch != plan_.microbatch) return loss;
    fired_ = true;
    return loss * std::numeric_limits<double>::quiet_NaN();
  }

 private:
  FaultPlan plan_;
  std::array<std::atomic<int>, 16> actions_{};  // per stage: actions begun this step
  std::atomic<bool> fired_{false};
};


}  // namespace conveyor::testing
