#include "schedules/stash_memory.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace conveyor::schedules {

namespace {

void check_sizes(const char* what, const Schedule& s, const std::vector<std::vector<int64_t>>& bytes) {
  if (static_cast<int>(bytes.size()) != s.num_stages) {
    throw std::invalid_argument(std::string(what) + ": sizes are given for " + std::to_string(bytes.size()) +
                                " stages, the schedule has " + std::to_string(s.num_stages));
  }
  for (int k = 0; k < s.num_stages; ++k) {
    if (static_cast<int>(bytes[k].size()) < s.num_microbatches) {
      throw std::invalid_argument(std::string(what) + ": stage " + std::to_string(k) + " has sizes for " +
                                  std::to_string(bytes[k].size()) + " micro-batches, the schedule has " +
                                  std::to_string(s.num_microbatches));
    }
  }
}

// What `a` adds to (an F) or takes from (a B or W) what its stage holds; a
// split backward frees at its W.
int64_t change(const Action& a, const std::vector<std::vector<int64_t>>& bytes) {
  if (a.kind == ActionKind::kForward) return bytes[a.stage][a.microbatch];
  return a.kind == ActionKind::kBackwardInput ? 0 : -bytes[a.stage][a.microbatch];
}

int64_t peak_of(const std::vector<Action>& line, const std::vector<std::vector<int64_t>>& bytes) {
  int64_t held = 0, peak = 0;
  for (const Action& a : line) peak = std::max(peak, held += change(a, bytes));
  return peak;
}

}  // namespace

std::vector<int64_t> peak_stash_bytes(const Schedule& s, const std::vector<std::vector<int64_t>>& bytes) {
  check_sizes("peak_stash_bytes", s, bytes);
  std::vector<int64_t> peaks(s.num_stages, 0);
  for (int k = 0; k < s.num_stages; ++k) peaks[k] = peak_of(stage_actions(s, k), bytes);
  return peaks;
}

std::vector<int64_t> peak_worker_stash_bytes(const Schedule& s, const std::vector<std::vector<int64_t>>& bytes) {
  check_sizes("peak_worker_stash_bytes", s, bytes);
  std::vector<int64_t> peaks;
  for (const auto& line : s.workers) peaks.push_back(peak_of(line, bytes));
  return peaks;
}

std::vector<int64_t> microbatch_sizes(int64_t n, int m) {
  if (m < 1) throw std::invalid_argument("microbatch_sizes: need at least one micro-batch, got " + std::to_string(m));
  std::vector<int64_t> sizes(m, n / m);
  for (int i = 0; i < n % m; ++i) ++sizes[i];
  return sizes;
}

}  // namespace conveyor::schedules
