#include "plugin/runtime/loss_scaler.h"

#include "plugin/core/errors.h"

#include <cmath>

namespace conveyor {

LossScaler::LossScaler(LossScaling config) : config_(config) {
  state_.scale = static_cast<float>(config_.init_scale());
}

void LossScaler::update(bool found_inf) {
  const float scale = static_cast<float>(state_.scale);
  if (found_inf) {
    state_.scale = scale * static_cast<float>(config_.backoff_factor());
    state_.growth_tracker = 0;
    return;
  }
  if (++state_.growth_tracker < config_.growth_interval()) return;
  const float grown = scale * static_cast<float>(config_.growth_factor());
  if (std::isfinite(grown)) state_.scale = grown;
  state_.growth_tracker = 0;
}

void LossScaler::restore(const LossScalerState& state) {
  check_argument(std::isfinite(state.scale) && state.scale > 0 && state.growth_tracker >= 0,
                 "conveyor: a loss scaler's state needs a positive finite scale and a non-negative growth tracker, "
                 "got scale ",
                 state.scale, " and growth tracker ", state.growth_tracker);
  state_ = state;
}

}  // namespace conveyor
