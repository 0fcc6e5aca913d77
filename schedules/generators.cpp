#include "schedules/generators.h"

#include "schedules/v_shape.h"

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
  s.workers.resize(k);
  return s;
}

Action F(int stage, int mb) { return {stage, ActionKind::kForward, mb}; }
Action B(int stage, int mb) { return {stage, ActionKind::kBackward, mb}; }
Action I(int stage, int mb) { return {stage, ActionKind::kBackwardInput, mb}; }
Action W(int stage, int mb) { return {stage, ActionKind::kWeight, mb}; }

}  // namespace

Schedule make_sequential(int num_stages, int num_microbatches) {
  Schedule s = empty("sequential", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) {
      s.workers[k].push_back(F(k, mb));
      s.workers[k].push_back(B(k, mb));
    }
  }
  return s;
}

Schedule make_gpipe(int num_stages, int num_microbatches) {
  Schedule s = empty("gpipe", num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    for (int mb = 0; mb < num_microbatches; ++mb) s.workers[k].push_back(F(k, mb));
    for (int mb = 0; mb < num_microbatches; ++mb) s.workers[k].push_back(B(k, mb));
  }
  return s;
}

namespace {

// Stage k runs min(M, lead * (K-1-k)) warm-up forwards, then one forward and
// one backward at a time, then the remaining backwards.
Schedule one_forward_one_backward(const char* name, int num_stages, int num_microbatches, int lead) {
  Schedule s = empty(name, num_stages, num_microbatches);
  for (int k = 0; k < num_stages; ++k) {
    const int warmup = std::min(num_microbatches, lead * (num_stages - k - 1));
    int next_f = 0, next_b = 0;
    while (next_f < warmup) s.workers[k].push_back(F(k, next_f++));
    while (next_f < num_microbatches) {
      s.workers[k].push_back(F(k, next_f++));
      s.workers[k].push_back(B(k, next_b++));
    }
    while (next_b < num_microbatches) s.workers[k].push_back(B(k, next_b++));
  }
  return s;
}

}  // namespace

Schedule make_1f1b(int num_stages, int num_microbatches) {
  return one_forward_one_backward("1f1b", num_stages, num_microbatches, 1);
}

Schedule make_eager_1f1b(int num_stages, int num_microbatches, int lookahead) {
  if (lookahead < 1) {
    throw std::invalid_argument("eager 1F1B runs at least 1 forward ahead per later stage, got " +
                                std::to_string(lookahead) + " (with 0 it is 1f1b)");
  }
  return one_forward_one_backward("eager-1f1b", num_stages, num_microbatches, 1 + lookahead);
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

namespace {

// The looped 1F1B family on K workers of v chunks (stage c*K + w on worker
// w). Worker w's i-th forward belongs to chunk (i / g) % v, rounds of g
// micro-batches (g = K; one round of M when v = 1); its i-th backward after the warm-up to chunk v-1 minus the
// same. Warm-up: (v-1)*g + factor*(K-1-w) forwards, then one forward and one
// backward per step, then the remaining backwards. With split backwards,
// worker w's W's trail its I's by w: they fill the cooldown.
Schedule looped(const char* name, int k_workers, int v, int m, bool split) {
  Schedule s = empty(name, k_workers, m);
  if (v < 1) throw std::invalid_argument(std::string(name) + " needs at least 1 chunk per worker, got " +
                                         std::to_string(v));
  // Micro-batches go through the chunks in rounds of K: M must fill whole
  // rounds (otherwise a warm-up of whole-batch rounds would deadlock bounded
  // channels).
  if (v > 1 && m % k_workers != 0) {
    throw std::invalid_argument(std::string(name) + " sends micro-batches through the chunks in rounds of one per " +
                                "worker: " + std::to_string(m) + " micro-batches do not fill rounds of " +
                                std::to_string(k_workers) + " (use a multiple of " + std::to_string(k_workers) + ")");
  }
  const int g = v > 1 ? k_workers : m;  // micro-batches per round
  s.num_stages = k_workers * v;
  if (v > 1) {
    for (int st = 0; st < s.num_stages; ++st) s.placement.push_back(st % k_workers);
  }
  const int total = m * v;
  for (int w = 0; w < k_workers; ++w) {
    const int factor = v > 1 && !split ? 2 : 1;
    const int warm = std::min((v - 1) * g + factor * (k_workers - 1 - w), total);
    const auto forward_stage = [&](int i) { return ((i / g) % v) * k_workers + w; };
    const auto backward_stage = [&](int i) { return (v - 1 - ((i - warm) / g) % v) * k_workers + w; };
    std::vector<int> next_f(s.num_stages, 0), next_b(s.num_stages, 0), next_w(s.num_stages, 0);
    std::vector<int> backward_stages;  // in the order the I's ran
    size_t weights_done = 0;
    auto& line = s.workers[w];
    const auto add_backward = [&](int i) {
      const int st = backward_stage(i);
      line.push_back(split ? I(st, next_b[st]++) : B(st, next_b[st]++));
      backward_stages.push_back(st);
      if (split && i - warm >= w) {
        const int ws = backward_stages[weights_done++];
        line.push_back(W(ws, next_w[ws]++));
      }
    };
    for (int i = 0; i < total + warm; ++i) {
      if (i < total) {
        const int st = forward_stage(i);
        line.push_back(F(st, next_f[st]++));
      }
      if (i >= warm) add_backward(i);
    }
    while (split && weights_done < backward_stages.size()) {
      const int ws = backward_stages[weights_done++];
      line.push_back(W(ws, next_w[ws]++));
    }
  }
  return s;
}

}  // namespace

Schedule make_interleaved_1f1b(int num_workers, int chunks, int num_microbatches) {
  if (chunks < 2) {
    throw std::invalid_argument("interleaved 1F1B needs at least 2 chunks per worker, got " + std::to_string(chunks) +
                                " (with 1 it is 1f1b)");
  }
  return looped("interleaved", num_workers, chunks, num_microbatches, false);
}

Schedule make_zb_h1(int num_stages, int num_microbatches) {
  return looped("zb-h1", num_stages, 1, num_microbatches, true);
}

Schedule make_interleaved_zb(int num_workers, int chunks, int num_microbatches) {
  if (chunks < 2) {
    throw std::invalid_argument("interleaved zero bubble needs at least 2 chunks per worker, got " +
                                std::to_string(chunks) + " (with 1 it is zb-h1)");
  }
  return looped("zb-interleaved", num_workers, chunks, num_microbatches, true);
}

Schedule make_forward_only(int num_stages, int num_microbatches, const std::vector<int>& placement) {
  Schedule s = empty("forward", num_stages, num_microbatches);
  if (placement.empty()) {
    for (int k = 0; k < num_stages; ++k) {
      for (int mb = 0; mb < num_microbatches; ++mb) s.workers[k].push_back(F(k, mb));
    }
    return s;
  }
  if (static_cast<int>(placement.size()) != num_stages) {
    throw std::invalid_argument("a placement of " + std::to_string(placement.size()) + " stages for " +
                                std::to_string(num_stages));
  }
  s.placement = placement;
  s.workers.assign(*std::max_element(placement.begin(), placement.end()) + 1, {});
  for (int mb = 0; mb < num_microbatches; ++mb) {
    for (int k = 0; k < num_stages; ++k) s.workers.at(placement[k]).push_back(F(k, mb));
  }
  return s;
}

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all = {"sequential", "gpipe", "1f1b", "eager-1f1b", "interleaved", "zb-h1",
                                    "zb-interleaved"};
    all.insert(all.end(), v_shape_names().begin(), v_shape_names().end());
    for (const char* asynchronous : {"pipedream", "ddg", "fr"}) all.push_back(asynchronous);
    return all;
  }();
  return names;
}

const std::vector<std::string>& schedule_names(bool synchronous) {
  static const auto split = [] {
    std::pair<std::vector<std::string>, std::vector<std::string>> out;  // asynchronous, synchronous
    for (const auto& name : schedule_names()) {
      (make_schedule(name, 2, 4).synchronous() ? out.second : out.first).push_back(name);
    }
    return out;
  }();
  return synchronous ? split.second : split.first;
}

namespace {

std::string lowercase(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

}  // namespace

bool is_interleaved(const std::string& name) {
  const std::string lower = lowercase(name);
  return lower == "interleaved" || lower == "zb-interleaved";
}

bool is_v_shape(const std::string& name) {
  const std::string lower = lowercase(name);
  return std::find(v_shape_names().begin(), v_shape_names().end(), lower) != v_shape_names().end();
}

int default_chunks(const std::string& name) { return is_interleaved(name) || is_v_shape(name) ? 2 : 1; }

Schedule make_schedule(const std::string& name, int num_stages, int num_microbatches, bool vertical_sync,
                       int chunks, int lookahead) {
  const std::string lower = lowercase(name);
  if (lower == "eager-1f1b") {
    if (chunks > 1) throw std::invalid_argument("schedule 'eager-1f1b' runs one stage per worker, not " +
                                                std::to_string(chunks) + " chunks");
    return make_eager_1f1b(num_stages, num_microbatches, lookahead == 0 ? 1 : lookahead);
  }
  if (lookahead != 0) {
    throw std::invalid_argument("only eager-1f1b runs forwards ahead (lookahead " + std::to_string(lookahead) +
                                " asked of '" + lower + "')");
  }
  if (chunks == 0) chunks = default_chunks(lower);
  if (is_v_shape(lower)) {
    if (chunks != 2) {
      throw std::invalid_argument("schedule '" + lower + "' runs 2 chunks per worker in a V, not " +
                                  std::to_string(chunks));
    }
    if (vertical_sync) throw std::invalid_argument("vertical sync is pipedream's; '" + lower + "' is synchronous");
    return make_v_shape(lower, num_stages, num_microbatches);
  }
  if (lower == "interleaved") return make_interleaved_1f1b(num_stages, chunks, num_microbatches);
  if (lower == "zb-interleaved") return make_interleaved_zb(num_stages, chunks, num_microbatches);
  const auto& names = schedule_names();
  if (chunks != 1 && std::find(names.begin(), names.end(), lower) != names.end()) {
    throw std::invalid_argument("schedule '" + lower + "' runs one stage per worker, not " + std::to_string(chunks) +
                                " chunks (interleaved and zb-interleaved run several, the V schedules 2)");
  }
  if (lower == "zb-h1") return make_zb_h1(num_stages, num_microbatches);
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
