#pragma once
// Brute force for the planner's tests: every split of a model into stages.

#include <cstdint>
#include <functional>
#include <vector>

namespace conveyor::testing {

// Calls fn with every split of n layers into k contiguous non-empty stages
// (its k - 1 cuts, increasing); `cuts` holds the cuts made so far.
inline void every_split(int64_t n, int k, std::vector<int64_t>& cuts,
                        const std::function<void(const std::vector<int64_t>&)>& fn) {
  if (static_cast<int>(cuts.size()) == k - 1) return fn(cuts);
  for (int64_t b = cuts.empty() ? 1 : cuts.back() + 1; b < n; ++b) {
    cuts.push_back(b);
    every_split(n, k, cuts, fn);
    cuts.pop_back();
  }
}

}  // namespace conveyor::testing
