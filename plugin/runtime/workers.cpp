#include "plugin/runtime/workers.h"

#include <utility>

namespace conveyor {

WorkerThreads::WorkerThreads(int count) : errors_(count) {
  for (int k = 0; k < count; ++k) threads_.emplace_back([this, k] { loop(k); });
}

WorkerThreads::~WorkerThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<std::exception_ptr> WorkerThreads::run(const std::function<void(int)>& fn) {
  const at::ThreadLocalState caller_state;
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  caller_state_ = &caller_state;
  errors_.assign(threads_.size(), nullptr);
  pending_ = static_cast<int>(threads_.size());
  ++generation_;
  start_.notify_all();
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  caller_state_ = nullptr;
  return errors_;
}

void WorkerThreads::loop(int k) {
  long seen = 0;
  while (true) {
    const std::function<void(int)>* job;
    const at::ThreadLocalState* state;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      state = caller_state_;
    }
    std::exception_ptr error;
    try {
      const at::ThreadLocalStateGuard caller_state(*state);
      (*job)(k);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Handed off, not shared: the worker keeps no reference to the
      // exception that the caller reads (and frees) once the step is over.
      errors_[k] = std::move(error);
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

}  // namespace conveyor
