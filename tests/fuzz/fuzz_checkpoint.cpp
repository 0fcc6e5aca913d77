// libFuzzer target: the checkpoint loader's checking half (decode_checkpoint,
// plugin/checkpoint/checkpoint_decode.h), fed any bytes as a checkpoint file,
// against the fixed pipeline of checkpoint_fixture.h in its set-ups, and cut
// in three stages (a checkpoint of two is resharded), and as two processes'
// files merged (checkpoint_set.h).
// Any file may be refused, with std::invalid_argument only, and then nothing
// may have changed; a file it accepts must restore (apply_checkpoint) and
// leave optimizers that can step. Nothing may crash, hang, leak or trip a
// sanitizer.
#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_set.h"
#include "tests/fuzz/checkpoint_fixture.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace {

using conveyor::fuzzing::Setup;

[[noreturn]] void fail(const char* why, const char* detail = "") {
  std::fprintf(stderr, "fuzz_checkpoint: %s %s\n", why, detail);
  std::abort();
}

// The pipeline as the loader sees it (plugin/checkpoint/checkpoint.cpp builds
// the same from a Pipeline), with a generator of its own for the global one.
struct Fixture {
  torch::nn::Sequential model = conveyor::fuzzing::fixture_model();
  std::vector<std::unique_ptr<torch::optim::Optimizer>> owned;
  conveyor::CheckpointTarget target;

  explicit Fixture(Setup setup) {
    const std::vector<int64_t> cuts = setup == Setup::kResharded ? conveyor::fuzzing::resharded_boundaries()
                                                                 : std::vector<int64_t>{conveyor::fuzzing::kSplit};
    target.num_stages = static_cast<int>(cuts.size()) + 1;
    for (const auto& p : model->named_parameters()) target.tensors.emplace_back(p.key(), p.value());
    for (const auto& b : model->named_buffers()) target.tensors.emplace_back(b.key(), b.value());
    for (const auto& p : model->named_parameters()) target.names[p.value().unsafeGetTensorImpl()] = p.key();
    target.stages.resize(static_cast<size_t>(target.num_stages));
    if (setup == Setup::kCaller) {
      owned.push_back(conveyor::fuzzing::caller_adam(model->parameters()));
      target.optimizers.push_back(owned.back().get());
    } else {
      for (int k = 0; k < target.num_stages; ++k) {
        std::vector<at::Tensor> params;
        const int64_t begin = k == 0 ? 0 : cuts[k - 1], end = k + 1 < target.num_stages ? cuts[k] : 4;
        for (int64_t i = begin; i < end; ++i) {
          for (const auto& p : model[i]->parameters()) params.push_back(p);
        }
        owned.push_back(conveyor::fuzzing::stage_sgd(params));
        target.stages[k].optimizer = owned.back().get();
        if (setup == Setup::kOwn) target.stages[k].random = c10::Device(c10::kCPU);
      }
    }
    target.generators.push_back(at::make_generator<at::CPUGeneratorImpl>(11));
  }
};

struct Snapshot {
  std::vector<at::Tensor> tensors;
  std::vector<size_t> states;
  std::vector<double> lrs;
  at::Tensor generator;

  explicit Snapshot(const Fixture& f) {
    for (const auto& [name, t] : f.target.tensors) tensors.push_back(t.clone());
    for (const auto& opt : f.owned) {
      states.push_back(opt->state().size());
      for (const auto& g : opt->param_groups()) lrs.push_back(g.options().get_lr());
    }
    generator = f.target.generators[0].get_state();
  }
  bool operator==(const Snapshot& o) const {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!torch::equal(tensors[i], o.tensors[i])) return false;
    }
    return states == o.states && lrs == o.lrs && torch::equal(generator, o.generator);
  }
};

// `merged`: the bytes as two processes' files of one checkpoint
// (plugin/checkpoint/checkpoint_set.h), merged with each other first.
void run(const std::vector<char>& bytes, Setup setup, bool merged = false) {
  Fixture f(setup);
  const Snapshot before(f);
  conveyor::CheckedCheckpoint checked;
  try {
    checked = merged ? conveyor::decode_checkpoint(conveyor::merge_checkpoints({{"a.ckpt", bytes}, {"b.ckpt", bytes}}),
                                                   "a.ckpt, b.ckpt", f.target)
                     : conveyor::decode_checkpoint(bytes, "fuzz.ckpt", f.target);
  } catch (const std::invalid_argument&) {
    if (!(Snapshot(f) == before)) fail("a refused checkpoint changed the pipeline");
    return;
  } catch (const std::exception& e) {
    fail("refused a checkpoint with an exception other than std::invalid_argument:", e.what());
  }
  if (!(Snapshot(f) == before)) fail("checking a checkpoint changed the pipeline");
  const auto stages = static_cast<size_t>(f.target.num_stages);
  if (checked.updates.size() != stages || checked.random.size() != stages) fail("a checked checkpoint lacks stages");
  try {
    conveyor::apply_checkpoint(checked, f.target);
    for (const auto& random : checked.random) {
      if (random) at::make_generator<at::CPUGeneratorImpl>().set_state(random->cpu);
    }
    // What was restored must be usable: one step of every optimizer.
    for (const auto& p : f.model->parameters()) p.mutable_grad() = torch::ones_like(p);
    for (const auto& opt : f.owned) opt->step();
  } catch (const std::exception& e) {
    fail("an accepted checkpoint failed to restore or to step:", e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  run(bytes, Setup::kCaller);
  run(bytes, Setup::kOwn);
  run(bytes, Setup::kOwnSync);
  run(bytes, Setup::kResharded);
  run(bytes, Setup::kOwnSync, /*merged=*/true);
  run(bytes, Setup::kResharded, /*merged=*/true);
  return 0;
}
