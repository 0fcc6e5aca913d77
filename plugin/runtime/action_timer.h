#pragma once
// ActionTimer: where a stage's step time went, action by action. On an
// accelerator the host only queues work, so actions are timed by events on
// the stage's stream and read once the stream has finished; on the CPU the
// host clock is the truth, less the time an action spent blocked in the
// transport before and after its compute (that is waiting, not busy time).

#include "plugin/core/step_result.h"
#include "plugin/support/timing.h"
#include "schedules/action.h"

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace conveyor {

class ActionTimer {
 public:
  // `step_start`: when the step began (trace times count from it). With a
  // `stream` and `trace` on, actions are timed on the stream.
  ActionTimer(const std::optional<c10::Stream>& stream, bool trace, Clock::time_point step_start);

  void begin();
  // `waited_before` / `waited_after`: seconds the action spent blocked in the
  // transport before and after its compute.
  void end(const schedules::Action& action, double waited_before, double waited_after);
  // After the stage's stream has finished its work: reads the events.
  void finish();

  // The part of it spent on stage k's actions (a worker may run several).
  double busy_seconds(int stage) const;
  std::vector<TraceEvent>& trace() { return trace_; }

 private:
  std::optional<c10::Stream> stream_;  // set when timing on the device
  bool trace_on_;
  Clock::time_point step_start_;
  Clock::time_point begun_;
  double base_us_ = 0;
  std::optional<c10::Event> origin_;
  std::vector<std::pair<c10::Event, c10::Event>> events_;
  std::vector<schedules::Action> timed_;
  std::map<int, double> stage_busy_;
  std::vector<TraceEvent> trace_;
};

}  // namespace conveyor
