#include "plugin/model/stage_random.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>

namespace conveyor {
namespace {

// One stage at a time has its streams in the global generators. The lock
// guards those generators, which are the process's (every pipeline's layers
// draw from them), so it is the process's too: with a lock per pipeline, two
// pipelines' stages could swap their streams into the same generator at once
// and draw each other's numbers. Pipelines without stage_rng never take it.
std::mutex& turn() {
  static std::mutex mutex;
  return mutex;
}

at::Generator global_generator(const c10::Device& device) {
  return device.is_cpu() ? at::globalContext().defaultGenerator(c10::Device(c10::kCPU))
                         : at::globalContext().defaultGenerator(device);
}

at::Tensor state_of(at::Generator gen) {
  const std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void install(at::Generator gen, const at::Tensor& state) {
  const std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The state a generator of `device` has when seeded with `seed`.
at::Tensor seeded_state(const c10::Device& device, uint64_t seed) {
  at::Generator global = global_generator(device);
  at::Generator gen;
  {
    const std::lock_guard<std::mutex> lock(global.mutex());
    gen = global.clone();
  }
  gen.set_current_seed(seed);
  return gen.get_state();
}

}  // namespace

uint64_t StageRandom::stage_seed(uint64_t base, int k) {
  // splitmix64 of (base, k): neighbouring stages get unrelated streams.
  uint64_t z = base + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(k + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

StageRandom::StageRandom(uint64_t seed, c10::Device device) : device_(device) {
  state_.cpu = seeded_state(c10::Device(c10::kCPU), seed);
  if (!device_.is_cpu()) state_.device = seeded_state(device_, seed);
}

StageRandom::State StageRandom::swap_in(const State& state) {
  State replaced;
  at::Generator cpu = global_generator(c10::Device(c10::kCPU));
  replaced.cpu = state_of(cpu);
  install(cpu, state.cpu);
  if (state.device.defined()) {
    at::Generator dev = global_generator(device_);
    replaced.device = state_of(dev);
    install(dev, state.device);
  }
  return replaced;
}

void StageRandom::run_from(const State& from, State* after, const std::function<void()>& fn) {
  const std::lock_guard<std::mutex> lock(turn());
  const State global = swap_in(from);
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();  // the draws a failed forward made still count
  }
  State went = swap_in(global);
  if (after != nullptr) *after = std::move(went);
  if (failure) std::rethrow_exception(failure);
}

void StageRandom::run(const std::function<void()>& fn) { run_from(state_, &state_, fn); }

void StageRandom::replay(const State& from, const std::function<void()>& fn) { run_from(from, nullptr, fn); }

void StageRandom::set_state(const State& state) {
  TORCH_CHECK(state.cpu.defined(), "conveyor: a stage's random state needs its CPU part");
  TORCH_CHECK(state.device.defined() == !device_.is_cpu(), "conveyor: a random state ",
              state.device.defined() ? "with" : "without", " a device part does not fit a stage on ", device_.str());
  state_ = state;
}

}  // namespace conveyor
