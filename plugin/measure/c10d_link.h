#pragma once
// What it costs to move a tensor between two processes over c10d on this
// machine: the planner's link (LinkProfile, plugin/planner/profile.h) for a
// multi-process pipeline, measured rather than assumed.
//
//   auto profile = conveyor::profile_model(model, x, y, loss);
//   profile.link = conveyor::measure_c10d_link();   // ranks on this machine
//   options.profile(std::make_shared<conveyor::ModelProfile>(profile)).balance(conveyor::Balance::kTime);

#include "plugin/planner/profile.h"
#include "plugin/transport/c10d.h"

#include <chrono>
#include <cstdint>

namespace conveyor {

// Two Gloo ranks on 127.0.0.1 (threads of this process, real TCP sockets, as
// two local processes use them) pass a transfer back and forth as the c10d
// transport sends one: a header message, then the payload. Latency: half the
// round trip of a one-float payload; bandwidth: `large_bytes` over the extra
// one-way time a payload of that size takes. Medians of `repeats` round
// trips (at least 64 of the small one). Processor time: what the process
// (both ranks, Gloo's threads) used per transfer during the small round
// trips, and per byte beyond that during the large ones. With
// `shared_memory` (the transport's default), the message goes through a
// shared-memory ring as the transport's does with
// C10dTransportOptions::shared_memory (payloads past 1 MiB still on Gloo).
// Throws std::runtime_error if the ranks cannot connect within `timeout`.
LinkProfile measure_c10d_link(int64_t large_bytes = 4 << 20, int repeats = 9,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30),
                              bool shared_memory = C10dTransportOptions{}.shared_memory);

}  // namespace conveyor
