// The plugin's operator library, `conveyor`. Schedules are exposed as text so
// that Python (torch.ops.conveyor.*) and C++ share one format; each op folder
// of ops/ declares its own schemas with TORCH_LIBRARY_FRAGMENT.

#include "plugin/version.h"
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "schedules/v_shape.h"
#include "schedules/validate.h"

#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace conveyor {
namespace {

std::string version() { return CONVEYOR_VERSION; }

std::string schedule_text(const std::string& name, int64_t stages, int64_t microbatches) {
  return schedules::make_schedule(name, static_cast<int>(stages), static_cast<int>(microbatches)).str();
}

double v_memory_cap(const std::string& name, int64_t workers) {
  return schedules::v_memory_cap(name, static_cast<int>(workers));
}

void validate_schedule(const std::string& text, int64_t channel_capacity) {
  schedules::validate(schedules::Schedule::parse(text),
                      schedules::ValidateOptions{static_cast<int>(channel_capacity), true});
}

std::tuple<double, double, std::vector<int64_t>> simulate_schedule(const std::string& text, std::vector<double> forward,
                                                                   std::vector<double> backward, double transfer) {
  schedules::StageCosts costs;
  costs.forward = std::move(forward);
  costs.backward = std::move(backward);
  costs.transfer = transfer;
  const auto sim = schedules::simulate(schedules::Schedule::parse(text), costs);
  return {sim.makespan, sim.bubble_fraction, std::vector<int64_t>(sim.peak_inflight.begin(), sim.peak_inflight.end())};
}

}  // namespace

TORCH_LIBRARY(conveyor, m) {
  m.def("version() -> str", &version);
  // The text form of a generated schedule: torch.ops.conveyor.schedule("1f1b", 4, 8).
  m.def("schedule(str name, int stages, int microbatches) -> str", &schedule_text);
  // What a named V schedule lets a worker hold, in chunk activations: v_memory_cap("v-min", 6) is 5.
  m.def("v_memory_cap(str name, int workers) -> float", &v_memory_cap);
  // Raises with the offending action named; returns nothing when the schedule is sound.
  m.def("validate_schedule(str text, int channel_capacity=2) -> ()", &validate_schedule);
  // (makespan, bubble fraction, peak in-flight micro-batches per stage).
  m.def("simulate(str text, float[] forward_costs, float[] backward_costs, float transfer=0.) -> (float, float, int[])",
        &simulate_schedule);
}

}  // namespace conveyor
