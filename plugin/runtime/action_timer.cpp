#include "plugin/runtime/action_timer.h"

#include <algorithm>

namespace conveyor {

namespace {

double microseconds(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

ActionTimer::ActionTimer(const std::optional<c10::Stream>& stream, bool trace, Clock::time_point step_start)
    : trace_on_(trace), step_start_(step_start), base_us_(microseconds(Clock::now() - step_start)) {
  if (stream && trace) {
    stream_ = stream;
    origin_.emplace(stream_->device_type(), c10::EventFlag::BACKEND_DEFAULT);
    origin_->record(*stream_);
  }
}

void ActionTimer::begin() {
  begun_ = Clock::now();
  if (stream_) {
    events_.emplace_back(c10::Event(stream_->device_type(), c10::EventFlag::BACKEND_DEFAULT),
                         c10::Event(stream_->device_type(), c10::EventFlag::BACKEND_DEFAULT));
    events_.back().first.record(*stream_);
  }
}

void ActionTimer::end(const schedules::Action& action, double waited_before, double waited_after) {
  if (stream_) {
    events_.back().second.record(*stream_);
    timed_.push_back(action);
    return;
  }
  const double start_us = microseconds(begun_ - step_start_) + waited_before * 1e6;
  const double end_us = std::max(start_us, microseconds(Clock::now() - step_start_) - waited_after * 1e6);
  stage_busy_[action.stage] += (end_us - start_us) * 1e-6;
  if (trace_on_) trace_.push_back(TraceEvent{action, start_us, end_us});
}

void ActionTimer::finish() {
  if (!stream_) return;
  for (size_t i = 0; i < events_.size(); ++i) {
    const double s = base_us_ + 1000.0 * origin_->elapsedTime(events_[i].first);
    const double e = base_us_ + 1000.0 * origin_->elapsedTime(events_[i].second);
    stage_busy_[timed_[i].stage] += (e - s) * 1e-6;
    trace_.push_back(TraceEvent{timed_[i], s, e});
  }
}

double ActionTimer::busy_seconds(int stage) const {
  const auto it = stage_busy_.find(stage);
  return it == stage_busy_.end() ? 0.0 : it->second;
}

}  // namespace conveyor
