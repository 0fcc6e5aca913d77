#pragma once
// StageRandom: a stage's own random number streams (PipelineOptions::
// stage_rng). Stages run concurrently, so when several of them draw random
// numbers (dropout) from the global generators, which stage gets which
// numbers depends on timing, and no run can be repeated. With stage_rng,
// each stage keeps its own generator states, and a stage's forward computes
// with them installed in the global generators (CPU, and the stage's device),
// taking turns with the other stages' forwards. A stage's numbers then depend
// only on its seed and its own draws: runs repeat bit for bit, and a
// checkpoint saves and restores every stage's streams.
//
// The price: forwards (their host side, on accelerators) of different stages
// do not overlap. Waits for inputs happen outside the turn.
//
// Features replay recomputes a forward in the backward; it replays from the
// state the forward started with, so the dropout masks are the forward's.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>

namespace conveyor {

class StageRandom {
 public:
  // The generators' states, as at::Generator::get_state gives them.
  struct State {
    at::Tensor cpu;
    at::Tensor device;  // undefined for a CPU stage
  };

  // Streams seeded with `seed` for the CPU and, unless it is the CPU, `device`.
  StageRandom(uint64_t seed, c10::Device device);

  // Runs fn with this stage's streams installed, then keeps where they went
  // and puts the global ones back.
  void run(const std::function<void()>& fn);
  // Runs fn from `from` (a state() taken earlier) and leaves the streams as
  // they are: a replay draws what the original draw drew.
  void replay(const State& from, const std::function<void()>& fn);

  const State& state() const { return state_; }
  void set_state(const State& state);
  const c10::Device& device() const { return device_; }

  // The seed of stage k when the pipeline's seed is `base`.
  static uint64_t stage_seed(uint64_t base, int k);

 private:
  State swap_in(const State& state);  // returns the global states it replaced
  // Runs fn in this stage's turn with `from` installed; *after (if given)
  // receives where the streams went, also when fn throws.
  void run_from(const State& from, State* after, const std::function<void()>& fn);
  c10::Device device_;
  State state_;
};

}  // namespace conveyor
