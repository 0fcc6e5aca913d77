// libFuzzer target: the schedule text parser, the validator and the simulator
// (schedules/). Any text may be refused with std::invalid_argument; nothing
// may crash, hang, leak or trip a sanitizer, and what parses must print and
// parse back to the same schedule, what validates must simulate, and sharding
// placed on what validates must validate too.
#include "schedules/schedule.h"
#include "schedules/sharding.h"
#include "schedules/simulate.h"
#include "schedules/validate.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

namespace {

void fail(const char* what) {
  std::fprintf(stderr, "fuzz_schedule: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace conveyor::schedules;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Schedule schedule;
  try {
    schedule = Schedule::parse(text);
  } catch (const std::invalid_argument&) {
    return 0;  // refused with a message: fine
  }
  // Keep the work per input bounded: the fuzzer looks for crashes, not scale.
  if (schedule.num_stages > 64 || schedule.num_microbatches > 256) return 0;
  try {
    if (!(Schedule::parse(schedule.str()) == schedule)) fail("str() does not parse back to the same schedule");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("str() of a parsed schedule is refused by parse()");
  }
  try {
    validate(schedule);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  try {
    StageCosts costs = StageCosts::uniform(schedule.num_stages, 1.0, 2.0, 0.5);
    costs.unshard.assign(schedule.num_stages, 0.75);
    costs.reduce_grad.assign(schedule.num_stages, 1.5);
    const Simulation sim = simulate(schedule, costs);
    if (!(sim.makespan >= 0) || sim.bubble_fraction < -1e-9 || sim.bubble_fraction > 1 + 1e-9) {
      fail("simulate() of a valid schedule gave an impossible makespan or bubble");
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    fail("simulate() refused a schedule that validate() accepted");
  }
  // Sharding placed by the rules on a synchronous schedule: valid, and it prints and parses back.
  if (schedule.synchronous() && schedule.barriers.empty() && !schedule.has_sharding()) {
    try {
      const Schedule placed = place_sharding(schedule, {{.level = ShardLevel::kParameters, .regather = true}});
      validate(placed);
      if (!(Schedule::parse(placed.str()) == placed)) fail("a placed schedule does not parse back to itself");
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "%s\n", e.what());
      fail("place_sharding() refused, or made something validate() refuses, from a valid schedule");
    }
  }
  return 0;
}
