#pragma once
// Internal to the c10d transport (c10d.cpp: messages; c10d_ties.cpp: tied
// parameters): its wire constants and shared state.

#include "plugin/core/errors.h"
#include "plugin/support/timing.h"
#include "plugin/transport/c10d.h"
#include "plugin/transport/c10d_header.h"
#include "plugin/transport/shared_memory.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <string>
#include <vector>

namespace conveyor {

namespace c10d_wire {

using c10d::Work;

// Each message has a block of tags: the header's, then one per tensor. Ties
// use tags above every message's.
inline constexpr int kTagsPerMessage = C10dTransport::kMaxTensors + 1;
inline constexpr int kTieTags = 1 << 30;
// The first tag of micro-batch `mb`'s message across `boundary` (between
// stages boundary and boundary + 1) of a pipeline with `boundaries` of them.
inline int header_tag(Channel channel, int boundary, int boundaries, int mb) {
  const int64_t tag =
      ((static_cast<int64_t>(mb) * boundaries + boundary) * 2 + (channel == Channel::kGradient ? 1 : 0)) *
      kTagsPerMessage;
  TORCH_CHECK(tag + kTagsPerMessage <= kTieTags, "conveyor: micro-batch ", mb, " of a pipeline with ", boundaries,
              " boundaries has no c10d tags left: use fewer micro-batches or stages");
  return static_cast<int>(tag);
}

inline std::string shape_text(at::IntArrayRef sizes) { return c10::str(sizes); }

}  // namespace c10d_wire

using namespace c10d_wire;

struct C10dTransport::State {
  struct Posted {
    std::vector<c10::intrusive_ptr<Work>> works;  // the header's, then each payload's
    Tensors buffers;                               // alive until delivered
    std::string what;                              // "the activation of micro-batch 3"
    int to = 0;
  };

  c10::intrusive_ptr<c10d::Backend> group, device_group;
  std::unique_ptr<SharedMemoryLinks> links;  // null: every message on the groups
  C10dTransportOptions options;
  std::string prefix;  // "rank 3 (stage 1)"

  mutable std::mutex mutex;
  std::vector<Posted> posted;
  std::map<std::pair<int, int>, std::vector<Sent>> sent_activations;  // (stage, mb) -> what went out
  // The worker (process, the group's rank) of every stage: options.worker is
  // this process's. Identity unless the schedule has virtual stages.
  std::vector<int> placement;
  // Messages between two stages of this process: (channel, to, mb) -> tensors.
  std::map<std::tuple<Channel, int, int>, Tensors> local_messages;
  std::map<Channel, int64_t> device_sent, device_received;  // ordered accelerator payloads per channel
  std::vector<c10::intrusive_ptr<Work>> waiting;            // blocking waits abort() can wake
  std::string failure;
  Counts counts;

  // Receives posted before recv() asks for them, up to kPostedAhead per
  // channel: Gloo then writes a message into its buffer as soon as it is
  // sent, instead of waiting for recv() to say it is ready (a round trip).
  struct Ahead {
    at::Tensor buffer;
    c10::intrusive_ptr<Work> work;
  };
  static constexpr size_t kPostedAhead = 8;
  std::map<std::pair<Channel, int>, Ahead> ahead;                // (channel, micro-batch)
  std::map<Channel, std::deque<std::pair<int, int>>> expected;  // (from, micro-batch), in recv() order
  std::vector<at::Tensor> free_buffers;                          // kMessageBytes each

  at::Tensor take_buffer() {
    std::lock_guard<std::mutex> lock(mutex);
    if (free_buffers.empty()) return at::empty({kMessageBytes}, at::kByte);
    at::Tensor buffer = std::move(free_buffers.back());
    free_buffers.pop_back();
    return buffer;
  }
  void give_buffer(at::Tensor buffer) {
    std::lock_guard<std::mutex> lock(mutex);
    free_buffers.push_back(std::move(buffer));
  }

  // Posts the receive of the first part of micro-batch `mb`'s message on `channel`.
  Ahead post_receive(Channel channel, int from, int mb) {
    Ahead posted{take_buffer(), {}};
    const int peer = worker_of(from);
    if (links && links->receives_from(peer)) {
      posted.work = links->receive(peer, tag(channel, from, mb), posted.buffer);
      return posted;
    }
    std::vector<at::Tensor> list{posted.buffer};
    posted.work = group->recv(list, peer, tag(channel, from, mb));
    return posted;
  }

  // Tops up the receives posted ahead on `channel` from what is expected.
  // Never throws: posting ahead is an optimisation. If the group cannot post
  // (a peer closed its connections), the receive itself posts again when its
  // action runs and fails there, naming the action.
  void post_ahead(Channel channel) noexcept {
    try {
      post_expected(channel);
    } catch (const std::exception&) {
    }
  }

  void post_expected(Channel channel) {
    for (;;) {
      std::pair<int, int> next;
      {
        std::lock_guard<std::mutex> lock(mutex);
        auto& queue = expected[channel];
        const auto outstanding = std::count_if(ahead.begin(), ahead.end(),
                                               [&](const auto& entry) { return entry.first.first == channel; });
        if (!failure.empty() || queue.empty() || static_cast<size_t>(outstanding) >= kPostedAhead) return;
        next = queue.front();
        queue.pop_front();
        if (ahead.count({channel, next.second})) continue;
      }
      Ahead posted = post_receive(channel, next.first, next.second);
      std::lock_guard<std::mutex> lock(mutex);
      ahead.emplace(std::make_pair(channel, next.second), std::move(posted));
    }
  }

  int num_stages() const { return static_cast<int>(placement.size()); }
  int worker_of(int stage) const { return placement.at(static_cast<size_t>(stage)); }
  bool is_local(int stage) const { return stage >= 0 && stage < num_stages() && worker_of(stage) == options.worker; }
  // The tag of the message sent from stage `from` on `channel`.
  int tag(Channel channel, int from, int mb) const {
    const int boundary = channel == Channel::kActivation ? from : from - 1;
    return header_tag(channel, boundary, std::max(1, num_stages() - 1), mb);
  }

  std::string stage_name(int stage) const {
    const int worker = stage >= 0 && stage < num_stages() ? worker_of(stage) : -1;
    const int rank = worker >= 0 && worker < static_cast<int>(options.ranks.size()) ? options.ranks[worker] : -1;
    return c10::str("rank ", rank, " (stage ", stage, ")");
  }

  // Records the first failure and throws it; later calls rethrow it.
  [[noreturn]] void fail(const std::string& message, bool timeout = false) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure.empty()) failure = message;
    }
    if (timeout) throw TimeoutError(message);
    throw std::runtime_error(message);
  }

  void check_usable() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty()) {
      throw std::runtime_error(prefix + ": the transport failed earlier and cannot be used again (" + failure + ")");
    }
  }

  // A barrier of the whole group, bounded by the timeout; `what` completes
  // "waiting for ..." in its error, and "could not <verb> ..." if it cannot start.
  void group_barrier(const char* verb, const std::string& what) {
    c10d::BarrierOptions barrier_options;
    barrier_options.timeout = options.timeout;
    c10::intrusive_ptr<Work> work;
    try {
      work = group->barrier(barrier_options);
    } catch (const std::exception& e) {
      fail(prefix + ": could not " + verb + " " + what + " [" + message_of(e) + "]");
    }
    wait(work, Clock::now() + options.timeout, -1, what);
  }

  // Waits for `work` until `deadline`. `what` completes "waiting for ...".
  void wait(const c10::intrusive_ptr<Work>& work, Clock::time_point deadline, int peer, const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure.empty()) throw AbortedError(prefix + ": aborted (" + failure + ")");
      waiting.push_back(work);
    }
    const auto start = Clock::now();
    const auto remaining =
        std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(deadline - start));
    bool completed = false;
    std::string reason;
    try {
      completed = work->wait(remaining);
    } catch (const std::exception& e) {
      reason = message_of(e);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      waiting.erase(std::remove(waiting.begin(), waiting.end(), work), waiting.end());
    }
    if (completed && reason.empty()) return;
    if (reason.empty()) throw AbortedError(c10::str(prefix, ": aborted while waiting for ", what));
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    const bool timed_out = Clock::now() + std::chrono::milliseconds(10) >= deadline;
    const std::string how =
        timed_out ? c10::str("timed out after ", options.timeout.count(), " ms waiting for ", what)
                  : c10::str("lost the connection after ", waited.count(), " ms waiting for ", what, ", ",
                             peer >= 0 ? "which" : "a peer", " has probably exited");
    fail(c10::str(prefix, ": ", how, " [", reason, "]"), timed_out);
  }
};

}  // namespace conveyor
