#include "schedules/stash_memory.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace conveyor::schedules {

std::vector<int64_t> peak_stash_bytes(const Schedule& s, const std::vector<std::vector<int64_t>>& bytes) {
  if (static_cast<int>(bytes.size()) != s.num_stages) {
    throw std::invalid_argument("peak_stash_bytes: sizes are given for " + std::to_string(bytes.size()) +
                                " stages, the schedule has " + std::to_string(s.num_stages));
  }
  std::vector<int64_t> peaks(s.num_stages, 0);
  for (int k = 0; k < s.num_stages; ++k) {
    if (static_cast<int>(bytes[k].size()) < s.num_microbatches) {
      throw std::invalid_argument("peak_stash_bytes: stage " + std::to_string(k) + " has sizes for " +
                                  std::to_string(bytes[k].size()) + " micro-batches, the schedule has " +
                                  std::to_string(s.num_microbatches));
    }
    int64_t held = 0;
    for (const Action& a : stage_actions(s, k)) {
      if (a.kind == ActionKind::kForward) {
        held += bytes[k][a.microbatch];
        peaks[k] = std::max(peaks[k], held);
      } else if (a.kind != ActionKind::kBackwardInput) {  // a split backward frees at its W
        held -= bytes[k][a.microbatch];
      }
    }
  }
  return peaks;
}

std::vector<int64_t> microbatch_sizes(int64_t n, int m) {
  if (m < 1) throw std::invalid_argument("microbatch_sizes: need at least one micro-batch, got " + std::to_string(m));
  std::vector<int64_t> sizes(m, n / m);
  for (int i = 0; i < n % m; ++i) ++sizes[i];
  return sizes;
}

}  // namespace conveyor::schedules
