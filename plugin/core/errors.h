#pragma once
// The exceptions a pipeline throws. Bad configuration or input found before a
// step starts is a std::invalid_argument. A failure inside a step is a
// PipelineError, which names where it happened so the caller does not have to
// guess which of K threads raised it; DivergenceError is the PipelineError of
// a non-finite loss or gradient. TimeoutError and AbortedError are what
// blocking waits throw inside a step (a wait that ran out, a wait woken
// because another stage failed); the runtime reports them as PipelineErrors.

#include <c10/util/StringUtil.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace conveyor {

class PipelineError : public std::runtime_error {
 public:
  PipelineError(int stage, int microbatch, std::string action, const std::string& message, bool timed_out = false)
      : std::runtime_error(message),
        stage_(stage),
        microbatch_(microbatch),
        action_(std::move(action)),
        timed_out_(timed_out) {}

  int stage() const { return stage_; }                   // -1 when not tied to a stage
  int microbatch() const { return microbatch_; }         // -1 when not tied to a micro-batch
  const std::string& action() const { return action_; }  // text form, e.g. "1F3"; empty if none
  // Whether a blocking wait ran out (a stalled or dead peer): a TimeoutError inside the step.
  bool timed_out() const { return timed_out_; }

 private:
  int stage_;
  int microbatch_;
  std::string action_;
  bool timed_out_;
};

// A non-finite loss or gradient stopped training. The pipeline's weights (and
// its optimizers' state) are those of the last good step.
class DivergenceError : public PipelineError {
 public:
  DivergenceError(int64_t step, std::string schedule, int stage, int microbatch, std::string action,
                  const std::string& message)
      : PipelineError(stage, microbatch, std::move(action), message), step_(step), schedule_(std::move(schedule)) {}

  int64_t step() const { return step_; }                     // 1-based count of train steps, this one included
  const std::string& schedule() const { return schedule_; }  // the schedule's name, e.g. "pipedream"

 private:
  int64_t step_;
  std::string schedule_;
};

// Thrown by blocking waits that pass PipelineOptions::timeout.
class TimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An option of the wrong type (a str where an int belongs): a bad argument,
// which Python raises as TypeError rather than ValueError.
class OptionTypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown in the other stages' threads when one stage failed: they stop
// waiting and unwind; the caller sees the first stage's error, not these.
class AbortedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An exception's message without LibTorch's C++ backtrace (c10::Error's
// what() carries one), for messages that quote what a layer or peer said.
std::string message_of(const std::exception& e);

// How errors are raised, everywhere in the library:
//  - a message is built with c10::str(...), which streams its arguments
//    (numbers, strings, sizes, devices) one after another; it starts with
//    "conveyor: " and names what is wrong and what would be right;
//  - bad configuration or input found before a step runs is a
//    std::invalid_argument: check_argument(ok, message parts...);
//  - inside a step, an action's code throws what it throws (TORCH_CHECK
//    included), and the runtime reports it as a PipelineError that names the
//    stage, micro-batch and action.
template <typename... Parts>
void check_argument(bool ok, const Parts&... parts) {
  if (!ok) throw std::invalid_argument(c10::str(parts...));
}

}  // namespace conveyor
