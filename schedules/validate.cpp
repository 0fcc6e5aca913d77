#include "schedules/validate.h"

#include "schedules/blocking_replay.h"
#include "schedules/sharding.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace conveyor::schedules {

namespace {

std::string where(const Action& a, int position) {
  std::ostringstream os;
  os << "action " << a.str() << " (stage " << a.stage << ", position " << position << ", " << kind_name(a.kind)
     << " of micro-batch " << a.microbatch << ")";
  return os.str();
}

[[noreturn]] void fail(const std::string& message) { throw ScheduleError("invalid schedule: " + message); }

void check_shape(const Schedule& s) {
  if (s.num_stages < 1) fail("it has " + std::to_string(s.num_stages) + " stages");
  if (s.num_microbatches < 1) fail("it has " + std::to_string(s.num_microbatches) + " micro-batches");
  if (s.num_workers() > s.num_stages) {
    fail("it declares " + std::to_string(s.num_stages) + " stages but lists actions for " +
         std::to_string(s.num_workers()) + " workers");
  }
  if (static_cast<size_t>(s.num_stages) > s.num_actions()) {
    fail("it declares " + std::to_string(s.num_stages) + " stages but has only " + std::to_string(s.num_actions()) +
         " actions: every stage needs a worker whose line runs it");
  }
  if (!s.placement.empty() && static_cast<int>(s.placement.size()) != s.num_stages) {
    fail("its placement names " + std::to_string(s.placement.size()) + " stages, it has " +
         std::to_string(s.num_stages));
  }
  if (s.placement.empty() && s.has_virtual_stages()) {
    fail("it has " + std::to_string(s.num_stages) + " stages on " + std::to_string(s.num_workers()) +
         " workers but no placement");
  }
  for (int w = 0; w < s.num_workers(); ++w) {
    for (int i = 0; i < static_cast<int>(s.workers[w].size()); ++i) {
      const Action& a = s.workers[w][i];
      if (a.stage < 0 || a.stage >= s.num_stages) {
        fail(where(a, i) + ": stage out of range [0, " + std::to_string(s.num_stages) + ")");
      }
      if (s.worker_of(a.stage) != w) {
        fail(where(a, i) + " is listed for " + (s.has_virtual_stages() ? "worker " : "stage ") + std::to_string(w) +
             (s.has_virtual_stages() ? ", but stage " + std::to_string(a.stage) + " runs on worker " +
                                           std::to_string(s.worker_of(a.stage)) + " (a stage runs on one worker)"
                                     : ""));
      }
    }
  }
  std::vector<bool> hosts(s.num_workers(), false);
  for (int k = 0; k < s.num_stages; ++k) {
    const int w = s.worker_of(k);
    if (w < 0 || w >= s.num_workers()) {
      fail("stage " + std::to_string(k) + " is placed on no worker (no line runs its actions)");
    }
    hosts[w] = true;
  }
  for (int w = 0; w < s.num_workers(); ++w) {
    if (!hosts[w]) fail("worker " + std::to_string(w) + " runs no stage");
  }
}

// Per stage: each action in range, once; every backward after its forward;
// a split backward's W after its I, and never after a whole B.
void check_actions(const Schedule& s, bool require_backward) {
  struct Seen {
    std::set<int> forward, backward, input, weight;
  };
  std::vector<Seen> seen(s.num_stages);
  for (int w = 0; w < s.num_workers(); ++w) {
    for (int i = 0; i < static_cast<int>(s.workers[w].size()); ++i) {
      const Action& a = s.workers[w][i];
      const int k = a.stage;
      if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
        fail(where(a, i) + ": micro-batch out of range [0, " + std::to_string(s.num_microbatches) + ")");
      }
      Seen& st = seen[k];
      const Action forward{k, ActionKind::kForward, a.microbatch};
      switch (a.kind) {
        case ActionKind::kForward:
          if (!st.forward.insert(a.microbatch).second) fail(where(a, i) + " is repeated");
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (!st.backward.insert(a.microbatch).second) {
            fail(where(a, i) + " is repeated (micro-batch " + std::to_string(a.microbatch) +
                 "'s backward already ran on stage " + std::to_string(k) + ")");
          }
          if (!st.forward.count(a.microbatch)) fail(where(a, i) + ": backward before its forward " + forward.str());
          if (a.kind == ActionKind::kBackwardInput) st.input.insert(a.microbatch);
          break;
        case ActionKind::kWeight:
          if (!st.weight.insert(a.microbatch).second) fail(where(a, i) + " is repeated");
          if (!st.input.count(a.microbatch)) {
            const Action input{k, ActionKind::kBackwardInput, a.microbatch};
            if (st.backward.count(a.microbatch)) {
              fail(where(a, i) + ": the backward of micro-batch " + std::to_string(a.microbatch) +
                   " was whole (B), so no weight gradient is left for a W (split it: I, then W)");
            }
            fail(where(a, i) + ": weight backward before its input backward " + input.str());
          }
          break;
      }
    }
  }
  for (int k = 0; k < s.num_stages; ++k) {
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      if (!seen[k].forward.count(mb)) {
        fail("stage " + std::to_string(k) + " never runs the forward of micro-batch " + std::to_string(mb) +
             " (no action " + Action{k, ActionKind::kForward, mb}.str() + ")");
      }
      if (require_backward && !seen[k].backward.count(mb)) {
        fail("stage " + std::to_string(k) + " never runs the backward of micro-batch " + std::to_string(mb) +
             " (no action " + Action{k, ActionKind::kBackward, mb}.str() + ")");
      }
      if (seen[k].input.count(mb) && !seen[k].weight.count(mb)) {
        fail("stage " + std::to_string(k) + " never runs the weight backward of micro-batch " + std::to_string(mb) +
             " (no action " + Action{k, ActionKind::kWeight, mb}.str() + " after its " +
             Action{k, ActionKind::kBackwardInput, mb}.str() + ")");
      }
    }
  }
}

}  // namespace

// Declarations that contradict each other or the action lists.
void check_declarations(const Schedule& s) {
  if (!s.synchronous() && s.has_virtual_stages()) {
    fail("it puts several stages on one worker, which only a synchronous schedule may (step=batch): an update per "
         "micro-batch would need a weight version per stage and worker");
  }
  if (!s.synchronous() && s.splits_backward()) {
    fail("it splits backwards into I and W, which only a synchronous schedule may (step=batch)");
  }
  if (s.vertical_sync && !s.weight_stashing) fail("vertical sync is declared without weight stashing");
  if (s.weight_stashing && !s.step_per_microbatch) {
    fail("weight stashing is declared but the optimizer steps once per batch: there are no versions to stash");
  }
  if (!s.barriers.empty()) {
    if (static_cast<int>(s.barriers.size()) != s.num_workers()) fail("barriers are given for some workers only");
    for (int k = 0; k < s.num_workers(); ++k) {
      if (s.barriers[k].size() != s.barriers[0].size()) {
        fail("worker " + std::to_string(k) + " has " + std::to_string(s.barriers[k].size()) +
             " barriers, worker 0 has " + std::to_string(s.barriers[0].size()) +
             ": every worker must meet every barrier");
      }
      for (size_t i = 0; i < s.barriers[k].size(); ++i) {
        if (s.barriers[k][i] > s.workers[k].size() || (i > 0 && s.barriers[k][i] < s.barriers[k][i - 1])) {
          fail("worker " + std::to_string(k) + "'s barrier " + std::to_string(i) + " is out of order");
        }
      }
    }
  }
  if (!s.vertical_sync || !s.step_per_microbatch) return;
  // A forward can only use a version its stage has already produced.
  const auto versions = forward_versions(s);
  for (int k = 0; k < s.num_stages; ++k) {
    int steps = 0;
    for (int i = 0; i < static_cast<int>(s.workers[k].size()); ++i) {
      const Action& a = s.workers[k][i];
      if (a.kind == ActionKind::kBackward) ++steps;
      if (a.kind == ActionKind::kForward && versions[k][a.microbatch] > steps) {
        fail(where(a, i) + ": vertical sync needs weight version " + std::to_string(versions[k][a.microbatch]) +
             " but stage " + std::to_string(k) + " has made only " + std::to_string(steps) + " updates by then");
      }
    }
  }
}

void validate(const Schedule& schedule, const ValidateOptions& options) {
  check_shape(schedule);
  check_actions(schedule, options.require_backward);
  check_declarations(schedule);
  check_sharding(schedule);
  if (options.channel_capacity < 0) fail("channel capacity " + std::to_string(options.channel_capacity) + " < 0");
  replay_blocking(schedule, options.channel_capacity);
}

}  // namespace conveyor::schedules
