#pragma once
// How a CPU's workers slow each other: the profiler runs the model's own
// work on 1, 2, ... threads at once and records how much longer each run
// takes than alone (ModelProfile::slowdown, StageCosts::slowdown).

#include <functional>
#include <vector>

namespace conveyor::measure_detail {

// slowdown[n - 1], n = 1..max_workers: the wall time of `repeats` runs of
// `work` on each of n threads started together, over the same runs on one
// thread (slowdown[0] = 1). The median of `trials` measurements, kept
// non-decreasing in n. `work` must be safe to run on several threads at once.
std::vector<double> measure_slowdown(const std::function<void()>& work, int max_workers, int repeats, int trials = 3);

}  // namespace conveyor::measure_detail
