#pragma once
// LossScaler: the scale a dynamic loss scaler multiplies losses by, and its
// update after each verdict, with torch.amp.GradScaler's rules (the scale is
// held in fp32, as GradScaler holds it). The runtime owns one when loss
// scaling is on; see PipelineOptions::loss_scaling.

#include "plugin/core/option_list.h"
#include "plugin/core/types.h"

#include <cstdint>

namespace conveyor {

class LossScaler {
 public:
  // `config` within its rows' bounds (check_option_values checks them).
  explicit LossScaler(LossScaling config);

  double scale() const { return state_.scale; }
  // After an update's verdict: an inf or NaN backs the scale off and
  // restarts the count; a clean update counts, and growth_interval of them
  // in a row grow the scale (unless that would overflow fp32).
  void update(bool found_inf);

  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state);

 private:
  LossScaling config_;
  LossScalerState state_;
};

}  // namespace conveyor
