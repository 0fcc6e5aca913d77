#pragma once
// Internal to validate(): replays a schedule under the runtime's blocking
// transfer rules and throws ScheduleError when it deadlocks.

#include "schedules/schedule.h"

namespace conveyor::schedules {

// Every worker walks its line: an action first receives (F: the activation
// from stage k-1; B or I: the gradient from stage k+1), then sends (F to k+1,
// B or I to k-1); W moves nothing. A send waits while the channel holds
// `capacity` undelivered messages; with capacity 0 it also waits until its
// message is taken. Several stages on one worker share its line, so a worker
// that waits on itself deadlocks like any other. Assumes check_actions passed.
void replay_blocking(const Schedule& schedule, int capacity);

}  // namespace conveyor::schedules
