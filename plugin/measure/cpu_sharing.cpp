#include "plugin/measure/cpu_sharing.h"

#include "plugin/support/timing.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <latch>
#include <mutex>
#include <thread>

namespace conveyor::measure_detail {

namespace {

// Seconds from the moment n threads are all ready until the last of them
// has run `work` `repeats` times (after one run each to warm up).
double wall_of(const std::function<void()>& work, int n, int repeats) {
  std::latch ready(n + 1), go(1);
  std::vector<Clock::time_point> ends(n);
  std::exception_ptr failure;
  std::mutex failure_mutex;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      bool counted = false;
      try {
        work();
        ready.count_down();
        counted = true;
        go.wait();
        for (int r = 0; r < repeats; ++r) work();
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        if (!counted) ready.count_down();
      }
      ends[i] = Clock::now();
    });
  }
  ready.arrive_and_wait();
  const auto start = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start).count();
}

}  // namespace

std::vector<double> measure_slowdown(const std::function<void()>& work, int max_workers, int repeats, int trials) {
  std::vector<std::vector<double>> ratios(std::max(1, max_workers));
  for (int trial = 0; trial < std::max(1, trials); ++trial) {
    const double alone = wall_of(work, 1, repeats);
    for (int n = 2; n <= max_workers; ++n) ratios[n - 1].push_back(alone > 0 ? wall_of(work, n, repeats) / alone : 1.0);
  }
  std::vector<double> slowdown(ratios.size(), 1.0);
  for (size_t n = 1; n < ratios.size(); ++n) slowdown[n] = std::max(slowdown[n - 1], median(ratios[n]));
  return slowdown;
}

}  // namespace conveyor::measure_detail
