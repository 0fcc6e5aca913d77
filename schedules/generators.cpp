#include "schedules/generators.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace conveyor::schedules {

namespace {

Schedule empty(const char* name, int k, int m) {
  if (k < 1) throw std::invalid_argument("a schedule needs at least 1 stage, got " + std::to_string(k));
  if (m < 1) throw std::invalid_argument("a schedule needs at least 1 micro-batch, got " + std::to_string(m));
  Schedule s;
  s.name = name;
  s.num_stages = k;
  s.num_microbatches = m;
  s.stages.resize(k);
  return s;
}

Action F(int stage, int mb) { return {stage, ActionKind::kForward, mb}; }
Action B(int stage, int mb) { return {stage, ActionKind::kBackward, mb}; }

}  // namespace

Schedule make_sequential(int num_stages, int num_microbatches) {
  Schedule s = empty("sequential", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) {
      s.stages[k].push_back(F(k, mb));
      s.stages[k].push_back(B(k, mb));
    }
  }
  return s;
}

Schedule make_gpipe(int num_stages, int num_microbatches) {
  Schedule s = empty("gpipe", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(F(k, mb));
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(B(k, mb));
  }
  return s;
}

Schedule make_1f1b(int num_stages, int num_microbatches) {
  Schedule s = empty("1f1b", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    const int warmup = std::min(num_microbatches, num_stages - k - 1);
    int next_f = 0, next_b = 0;
    while (next_f < warmup) s.stages[k].push_back(F(k, next_f++));
    while (next_f < num_microbatches) {
      s.stages[k].push_back(F(k, next_f++));
      s.stages[k].push_back(B(k, next_b++));
    }
    while (next_b < num_microbatches) s.stages[k].push_back(B(k, next_b++));
  }
  return s;
}

namespace {

Schedule asynchronous(const char* name, int k, int m) {
  if (m < k) {
    throw std::invalid_argument(std::string(name) + " with " + std::to_string(m) + " micro-batches cannot fill a " +
                                std::to_string(k) + "-stage pipeline: give at least " + std::to_string(k) +
                                " (each micro-batch is a mini-batch with its own update)");
  }
  Schedule s = make_1f1b(k, m);
  s.name = name;
  s.step_per_microbatch = true;
  return s;
}

// Cuts stage k's 1F1B list into iterations t = 0 .. M+K-2: F(t), then
// B(t - d_k), each when in range.
void cut_into_iterations(Schedule& s) {
  const int k_stages = s.num_stages, m = s.num_microbatches;
  s.barriers.assign(k_stages, {});
  for (int k = 0; k < k_stages; ++k) {
    const int delay = k_stages - 1 - k;
    size_t at = 0;
    for (int t = 0; t < m + k_stages - 1; ++t) {
      if (t > 0) s.barriers[k].push_back(at);
      at += (t < m ? 1 : 0) + (t - delay >= 0 && t - delay < m ? 1 : 0);
    }
  }
}

}  // namespace

Schedule make_pipedream(int num_stages, int num_microbatches, bool vertical_sync) {
  Schedule s = asynchronous("pipedream", num_stages, num_microbatches);
  s.weight_stashing = true;
  s.vertical_sync = vertical_sync;
  return s;
}

Schedule make_ddg(int num_stages, int num_microbatches) {
  Schedule s = asynchronous("ddg", num_stages, num_microbatches);
  s.weight_stashing = true;
  cut_into_iterations(s);
  return s;
}

Schedule make_fr(int num_stages, int num_microbatches) {
  Schedule s = asynchronous("fr", num_stages, num_microbatches);
  s.stash = Stash::kInputs;
  cut_into_iterations(s);
  return s;
}

Schedule make_forward_only(int num_stages, int num_microbatches) {
  Schedule s = empty("forward", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.stages[k].push_back(F(k, mb));
  }
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"sequential", "gpipe", "1f1b", "pipedream", "ddg", "fr"};
  return names;
}

Schedule make_schedule(const std::string& name, int num_stages, int num_microbatches, bool vertical_sync) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "pipedream") return make_pipedream(num_stages, num_microbatches, vertical_sync);
  if (vertical_sync && std::find(schedule_names().begin(), schedule_names().end(), lower) != schedule_names().end()) {
    throw std::invalid_argument("vertical sync keeps stashed weight versions in step across stages; '" + lower +
                                "' has no weight stashing to synchronise (only pipedream has vertical sync)");
  }
  if (lower == "ddg") return make_ddg(num_stages, num_microbatches);
  if (lower == "fr") return make_fr(num_stages, num_microbatches);
  if (lower == "sequential") return make_sequential(num_stages, num_microbatches);
  if (lower == "gpipe") return make_gpipe(num_stages, num_microbatches);
  if (lower == "1f1b") return make_1f1b(num_stages, num_microbatches);
  std::string known;
  for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown schedule '" + name + "' (known: " + known + ")");
}

}  // namespace conveyor::schedules
