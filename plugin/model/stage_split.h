#pragma once
// StageSplit: which layers of the model each stage runs, and on which device.
// The planner decides it (plugin/planner/partition.h); the pipeline builds
// its stages from it.

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct StageSpec {
  int64_t begin = 0;  // first layer (index into the Sequential)
  int64_t end = 0;    // one past the last layer
  c10::Device device = c10::Device(c10::kCPU);
};

struct StageSplit {
  int64_t num_layers = 0;
  std::vector<StageSpec> stages;
  std::string str() const;  // "stage 0: layers [0, 3) on cpu; stage 1: ..."
};

}  // namespace conveyor
