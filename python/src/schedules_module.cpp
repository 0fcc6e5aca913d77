#include "python/src/schedules_module.h"

#include "plugin/trace/timeline.h"
#include "schedules/generators.h"
#include "schedules/sharding.h"
#include "schedules/simulate.h"

#include <c10/util/StringUtil.h>
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace py = pybind11;

namespace conveyor {

void define_schedules(py::module_& m) {
  m.def(
      "schedule_names",
      [](std::optional<bool> synchronous) {
        return synchronous ? schedules::schedule_names(*synchronous) : schedules::schedule_names();
      },
      py::arg("synchronous") = py::none(),
      "The schedules' names, from the schedule library's one list: all, or the synchronous or asynchronous ones.");
  m.def(
      "schedule_svg",
      [](const std::vector<std::string>& names, int workers, int microbatches, int chunks,
         const std::optional<std::string>& shard) {
        std::vector<TimelineBlock> blocks;
        for (const auto& name : names) {
          schedules::Schedule s = schedules::make_schedule(name, workers, microbatches, false, chunks);
          auto costs = schedules::StageCosts::uniform(s.num_stages, 1e-3, 2e-3);
          if (shard) {
            s = schedules::place_sharding(s, {{.level = schedules::shard_level_named(*shard)}});
            costs.unshard.assign(s.num_stages, 0.5e-3);
            costs.reduce_grad.assign(s.num_stages, 1e-3);
          }
          const auto sim = schedules::simulate(s, costs);
          blocks.push_back(timeline_block(sim, c10::str(s.name, ": ", workers, " workers, ", microbatches,
                                                        " micro-batches, bubble ",
                                                        std::lround(100 * sim.bubble_fraction), "%")));
        }
        return timeline_svg(blocks);
      },
      py::arg("names"), py::arg("workers"), py::arg("microbatches"), py::arg("chunks") = 0,
      py::arg("shard") = std::nullopt,
      "The named schedules simulated with a forward of 1 ms and a backward of 2 ms on every stage, drawn "
      "one above the other on one time axis as an SVG timeline (a row per worker); with a sharding level, "
      "its gathers (0.5 ms) and gradient reductions (1 ms) as placed by schedules::place_sharding.");
}

}  // namespace conveyor
