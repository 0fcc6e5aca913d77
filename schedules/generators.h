#pragma once
// Schedule generators: pure functions of (stages K, micro-batches M). Each
// returns stage k's actions in the order that stage runs them; the runtime
// only walks the lists, and transfers between stages order them in time.

#include "schedules/schedule.h"

#include <string>
#include <vector>

namespace conveyor::schedules {

// Naive model parallelism: one micro-batch at a time goes forward through
// every stage and back before the next starts. Stage k: F0 B0 F1 B1 ...
Schedule make_sequential(int num_stages, int num_microbatches);

// GPipe (fill-drain): every forward, then every backward. Holds M
// micro-batches per stage at the peak.
Schedule make_gpipe(int num_stages, int num_microbatches);

// 1F1B (PipeDream-Flush): stage k runs min(M, K-k-1) warm-up forwards, then
// alternates one forward and one backward, then drains. Same bubble as GPipe,
// at most min(M, K-k) micro-batches in flight on stage k.
Schedule make_1f1b(int num_stages, int num_microbatches);

// Inference: forwards only.
Schedule make_forward_only(int num_stages, int num_microbatches);

// By name, case-insensitive: "sequential", "gpipe", "1f1b" (see
// schedule_names()). Throws std::invalid_argument for an unknown name or
// K < 1 or M < 1.
Schedule make_schedule(const std::string& name, int num_stages, int num_microbatches);

// The names make_schedule() knows.
const std::vector<std::string>& schedule_names();

}  // namespace conveyor::schedules
