#pragma once
// validate(): proves a schedule can run before anything runs it. Rejects,
// naming the action: a stage or micro-batch out of range, a repeated action,
// a backward before its forward, a forward or backward that never happens,
// an order that deadlocks under blocking stage-to-stage transfers, and
// sharding actions that break their rules (sharding.h).

#include "schedules/schedule.h"

#include <stdexcept>

namespace conveyor::schedules {

struct ValidateOptions {
  // Messages a stage-to-stage channel holds before a send blocks; 0 means a
  // send waits until the receiver has taken the message (rendezvous).
  int channel_capacity = 2;
  // Every forward must be matched by a backward on the same stage (training).
  bool require_backward = true;
};

class ScheduleError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Throws ScheduleError with a message naming the first problem found.
void validate(const Schedule& schedule, const ValidateOptions& options = {});

}  // namespace conveyor::schedules
