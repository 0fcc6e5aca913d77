#pragma once
// What a schedule keeps between forwards and backwards, in bytes. A stage
// stashes micro-batch mb's entry when its forward of mb ends and frees it when
// its backward of mb begins (a split backward: its W), in the order the
// schedule lists its actions, so
// the peak is a property of the schedule and the entries' sizes alone:
// deterministic, and equal to what the runtime reports
// (StepResult::peak_stash_bytes) when the sizes are the runtime's.

#include "schedules/schedule.h"

#include <cstdint>
#include <vector>

namespace conveyor::schedules {

// bytes[k][mb]: the size of stage k's entry for micro-batch mb. Returns, per
// stage, the largest total held at once. Throws std::invalid_argument when
// `bytes` does not cover every stage and micro-batch.
std::vector<int64_t> peak_stash_bytes(const Schedule& schedule, const std::vector<std::vector<int64_t>>& bytes);

// The same entries counted per worker: the largest total its stages hold at
// once, in the order of its line. A worker of two chunks (a V, interleaved)
// holds less than the sum of its stages' peaks where those come at
// different times.
std::vector<int64_t> peak_worker_stash_bytes(const Schedule& schedule, const std::vector<std::vector<int64_t>>& bytes);

// Micro-batch sizes of a batch of n samples split into m: n / m each, the
// first n % m one larger (torch::tensor_split's split).
std::vector<int64_t> microbatch_sizes(int64_t n, int m);

}  // namespace conveyor::schedules
