#pragma once
// Mailbox: one directed stage-to-stage channel. Messages are keyed by
// micro-batch so a receiver waits for exactly the one its action needs; at most
// `capacity` undelivered messages are held (0 = a send waits until taken),
// which is the model schedules::validate() proves deadlock-free.

#include "plugin/core/errors.h"
#include "plugin/support/timing.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace conveyor {

template <typename Message>
class Mailbox {
 public:
  explicit Mailbox(int capacity) : capacity_(capacity) {}

  // `what` describes the wait for a timeout message, built only on failure.
  void put(int mb, Message message, Clock::time_point deadline, const std::function<std::string()>& what) {
    std::unique_lock<std::mutex> lock(mutex_);
    const size_t room = capacity_ > 0 ? static_cast<size_t>(capacity_) : 1;
    wait(lock, deadline, what, [&] { return messages_.size() < room; });
    messages_.insert_or_assign(mb, std::move(message));
    changed_.notify_all();
    if (capacity_ == 0) wait(lock, deadline, what, [&] { return messages_.count(mb) == 0; });
  }

  Message take(int mb, Clock::time_point deadline, const std::function<std::string()>& what) {
    std::unique_lock<std::mutex> lock(mutex_);
    wait(lock, deadline, what, [&] { return messages_.count(mb) > 0; });
    auto node = messages_.extract(mb);
    changed_.notify_all();
    return std::move(node.mapped());
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    changed_.notify_all();
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.clear();
    aborted_ = false;
  }

 private:
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, const std::function<std::string()>& what,
            Ready ready) {
    const bool ok = changed_.wait_until(lock, deadline, [&] { return aborted_ || ready(); });
    if (aborted_) throw AbortedError("aborted because another stage failed");
    if (!ok) throw TimeoutError(what());
  }

  const int capacity_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int, Message> messages_;
  bool aborted_ = false;
};

}  // namespace conveyor
