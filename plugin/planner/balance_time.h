#pragma once
// The split behind Balance::kTime: contiguous stages minimising the slowest
// stage's time, under a memory budget per stage, never cutting inside an
// atomic group. Pure arithmetic over costs the caller supplies (a profile,
// see plugin/planner/planner.h), so it is tested against brute force on small cases.

#include "plugin/core/types.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace conveyor {

struct SplitCosts {
  int64_t num_layers = 0;
  // Time of stage k holding layers [begin, end), per micro-batch, with its
  // transfers to and from its neighbours.
  std::function<double(int k, int64_t begin, int64_t end)> seconds;
  // Peak memory of stage k holding layers [begin, end). Unused without budgets.
  std::function<int64_t(int k, int64_t begin, int64_t end)> bytes;
  // Memory budget of each stage's device; empty: no limit.
  std::vector<int64_t> budgets;
  std::vector<AtomicGroup> atomic_groups;
  // Names for error messages ("layer 3 (linear(256->10000))"); may be empty.
  std::vector<std::string> layer_names;
};

// K-1 split points of the contiguous split with the smallest bottleneck
// (ties: the earliest split). Throws std::invalid_argument when the groups are
// malformed or leave too few places to cut, and when no split fits the
// budgets, naming the layer or group that does not fit and by how many bytes.
std::vector<int64_t> time_balanced_boundaries(const SplitCosts& costs, int num_stages);

// "1.50 MiB (1572864 bytes)", as budget errors say it.
std::string bytes_text(int64_t bytes);

// The slowest stage of the split given by `boundaries` (K-1 split points).
double bottleneck_seconds(const SplitCosts& costs, const std::vector<int64_t>& boundaries);

}  // namespace conveyor
