#pragma once
// WorkerThreads: one long-lived thread per worker (a worker runs one or more
// stages). run(fn) calls fn(i) on thread i for every i at once and returns
// when all have returned. Threads live as long as the pipeline so that
// per-thread state (intra-op pools, current streams) is set up once, not once
// per step.
//
// Each call runs under the thread-local state of run()'s caller
// (at::ThreadLocalState, as at::launch does): a profiler, autocast, saved-
// tensor hooks or record-function callbacks that are on where train_step is
// called also see the stages' work.

#include <ATen/ThreadLocalState.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace conveyor {

class WorkerThreads {
 public:
  explicit WorkerThreads(int count);
  ~WorkerThreads();
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Every exception fn(k) threw, by k (null where it returned normally).
  // fn must itself bound its blocking waits: run() waits for all of them.
  std::vector<std::exception_ptr> run(const std::function<void(int)>& fn);

 private:
  void loop(int k);

  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* job_ = nullptr;
  const at::ThreadLocalState* caller_state_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  long generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace conveyor
