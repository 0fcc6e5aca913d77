#pragma once
// LossScaler: the scale a dynamic loss scaler multiplies losses by, and its
// update after each verdict, with torch.amp.GradScaler's rules (the scale is
// held in fp32, as GradScaler holds it). The runtime owns one when loss
// scaling is on; see PipelineOptions::loss_scaling.

#include "plugin/types.h"

#include <cstdint>

namespace conveyor {

struct LossScalerConfig {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config);

  double scale() const { return state_.scale; }
  // After an update's verdict: an inf or NaN backs the scale off and
  // restarts the count; a clean update counts, and growth_interval of them
  // in a row grow the scale (unless that would overflow fp32).
  void update(bool found_inf);

  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace conveyor
