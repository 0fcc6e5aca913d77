#pragma once
// bench_pipeline --growth: how a pipelined step's time and memory grow with
// the micro-batch count M and the stage count K, predicted by the planner
// beside measured, and the simulator's projection to deeper pipelines.

#include <cstdint>

namespace conveyor::bench {

// The LSTM language model (bench_models.h) on `batch` sequences of 35 words
// under 1F1B for K = 1..4 and M = 1, 2, 4 ... 64: for each, the planner's
// prediction (one profile, split by time) against the median of `steps`
// measured steps, the configurations taking turns step by step; then the
// simulator's projection to 8, 16 and 64 stages from the costs measured at
// K = 1. Prints markdown tables; returns 0.
int growth_table(int steps, int64_t batch);

}  // namespace conveyor::bench
