#pragma once
// The ranks of the multi-process tests (tests/distributed/test_distributed.cpp): what each
// role computes and writes, and the data, model and file format the tests'
// single-process references share with them.

#include "plugin/checkpoint/checkpoint.h"
#include "plugin/distributed/distributed_runner.h"
#include "tensor_files.h"
#include "test_models.h"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>

namespace conveyor::testing {

constexpr int kBatch = 8;
constexpr int kMicrobatches = 4;
constexpr int kSteps = 3;

// ---------------------------------------------------------------------------
// What the ranks and the references share.

struct Data {
  at::Tensor x, y;
};

inline Data global_batch(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({kBatch, 8}, torch::kFloat64), torch::randn({kBatch, 3}, torch::kFloat64)};
}

inline torch::nn::Sequential seeded_mlp() {
  torch::manual_seed(0);
  return make_mlp();
}

inline OptimizerFactory sgd_momentum() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}

inline TensorMap grads_of(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  TensorMap out;
  for (const auto& [name, p] : named) out[name] = p.grad();
  return out;
}

inline TensorMap values_of(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  TensorMap out;
  for (const auto& [name, p] : named) out[name] = p;
  return out;
}

inline TensorMap values_of(const torch::nn::Sequential& model) { return values_of(model->named_parameters().pairs()); }

// Stalls or exits the process at its n-th forward (CONVEYOR_TEST_TRIP="exit:3"
// or "stall:2"), to play a peer that dies or hangs mid-step. Otherwise the identity.
struct TripwireImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    const char* trip = std::getenv("CONVEYOR_TEST_TRIP");
    if (!trip || std::getenv("CONVEYOR_TEST_TRIP_RANK") != std::string(std::getenv("RANK"))) return x;
    const std::string spec(trip);
    const int at_call = std::stoi(spec.substr(spec.find(':') + 1));
    if (++calls == at_call) {
      if (spec.rfind("exit", 0) == 0) ::_exit(9);
      std::this_thread::sleep_for(std::chrono::seconds(4));
    }
    return x;
  }
  int calls = 0;
};
TORCH_MODULE(Tripwire);

// The link every role's pipeline passes its messages over: Gloo's sockets,
// as between machines, unless CONVEYOR_TEST_SHARED_MEMORY is set
// (test_shared_memory runs the same roles over shared memory, the default
// between processes of one machine).
inline DistributedOptions link_options() {
  return DistributedOptions{.shared_memory = std::getenv("CONVEYOR_TEST_SHARED_MEMORY") != nullptr};
}

// ---------------------------------------------------------------------------
// The ranks.

struct Worker {
  LaunchEnvironment env;
  std::string out;
  c10::intrusive_ptr<c10d::Store> store;

  std::shared_ptr<ProcessGroups> groups(const std::string& name, int stages, std::chrono::milliseconds timeout) {
    ProcessGroups::Options options;
    options.name = name;
    options.timeout = timeout;
    options.connect_timeout = std::chrono::seconds(30);
    return std::make_shared<ProcessGroups>(store, env.rank, HybridLayout::for_world(env.world_size, stages), options);
  }
  std::string file(const std::string& what) const {
    return out + "/" + what + "-rank" + std::to_string(env.rank) + ".pt";
  }
  void note(const std::string& what, const std::string& text) const {
    std::ofstream(out + "/" + what + "-rank" + std::to_string(env.rank) + ".txt") << text;
  }
};

// The synchronous schedules the multi-process tests compare with the
// in-process runtime; "+recompute" asks for activation recomputation.
inline const std::vector<std::string>& synchronous_cases() {
  static const std::vector<std::string> cases = {"gpipe",        "1f1b",         "zb-h1",       "zb-h1+recompute",
                                                 "1f1b+offload", "eager-1f1b+2", "eager-1f1b+1"};
  return cases;
}

// Schedules with two chunks per process (virtual stages), on two ranks: the
// 7-layer MLP has too few layers for 4 ranks x 2 chunks.
inline const std::vector<std::string>& virtual_stage_cases() {
  static const std::vector<std::string> cases = {"interleaved", "zb-interleaved", "interleaved+recompute", "v-shape",
                                                 "zb-v",        "v-half",         "dualpipev",             "zb-v+recompute"};
  return cases;
}

// The V schedules on four ranks (stages r and 7 - r on rank r), 8
// micro-batches (DualPipeV needs 2 per rank), on a 9-layer MLP: 8 pieces.
inline const std::vector<std::string>& four_rank_v_cases() {
  static const std::vector<std::string> cases = {"zb-v", "v-half", "v-min", "dualpipev"};
  return cases;
}

inline torch::nn::Sequential seeded_deep_mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential m(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16), torch::nn::ReLU(),
                          torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8), torch::nn::Tanh(),
                          torch::nn::Linear(8, 3));
  m->to(torch::kFloat64);
  return m;
}

inline PipelineOptions four_rank_v_case(const std::string& name) {
  return PipelineOptions().microbatches(2 * kMicrobatches).schedule(name);
}

inline PipelineOptions synchronous_case(const std::string& name) {
  if (name == "v-shape") {  // the README's: rank 0 runs pieces 0 and 3, rank 1 pieces 1 and 2
    return PipelineOptions().microbatches(2).schedule_text(
        "0F0,0F1,3F0,3I0,3F1,3I1,0I0,3W0,0I1,3W1,0W0,0W1\n"
        "1F0,2F0,1F1,2F1,2I0,1I0,2I1,1I1,2W0,1W0,2W1,1W1\n");
  }
  const size_t plus = name.find('+');
  const std::string extra = plus == std::string::npos ? "" : name.substr(plus + 1);
  const bool ahead = !extra.empty() && std::isdigit(static_cast<unsigned char>(extra[0]));  // eager-1f1b's lookahead
  return PipelineOptions()
      .microbatches(kMicrobatches)
      .schedule(name.substr(0, plus))
      .lookahead(ahead ? std::stoi(extra) : 0)
      .recompute(extra == "recompute")
      .offload(extra == "offload");
}

// One stage per rank: gradients of the synchronous schedules, weights after pipedream.
inline void pipelines(Worker& w) {
  auto groups = w.groups("pipeline", w.env.world_size, std::chrono::seconds(20));
  const Data d = global_batch(0);
  std::vector<std::string> cases = synchronous_cases();
  if (w.env.world_size == 2) cases.insert(cases.end(), virtual_stage_cases().begin(), virtual_stage_cases().end());
  for (const std::string& schedule : cases) {
    DistributedRunner pipe(seeded_mlp(), PipelineOptions(synchronous_case(schedule)).distributed(link_options()), groups);
    const StepResult r = pipe.train_step(d.x, d.y, mse);
    TensorMap grads = grads_of(pipe.named_parameters());
    grads["loss"] = at::full({1}, r.loss, at::kDouble);
    write_tensors(w.file(schedule), grads);
  }
  for (const std::string& schedule : w.env.world_size == 4 ? four_rank_v_cases() : std::vector<std::string>{}) {
    DistributedRunner pipe(seeded_deep_mlp(), PipelineOptions(four_rank_v_case(schedule)).distributed(link_options()), groups);
    const StepResult r = pipe.train_step(d.x, d.y, mse);
    TensorMap grads = grads_of(pipe.named_parameters());
    grads["loss"] = at::full({1}, r.loss, at::kDouble);
    write_tensors(w.file("v4-" + schedule), grads);
  }
  DistributedRunner pipe(
      seeded_mlp(), PipelineOptions().microbatches(kMicrobatches).schedule("pipedream").optimizer(sgd_momentum()).distributed(link_options()),
      groups);
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    pipe.train_step(s.x, s.y, mse);
  }
  write_tensors(w.file("pipedream"), values_of(pipe.named_parameters()));
  // Each rank checkpoints its own stage; a fresh pipeline (other initial
  // weights) that loads it takes the next step exactly as the original does.
  save_checkpoint(w.file("pipedream-ckpt"), pipe.runner(), {kSteps, {}});
  torch::manual_seed(9);
  DistributedRunner resumed(
      make_mlp(), PipelineOptions().microbatches(kMicrobatches).schedule("pipedream").optimizer(sgd_momentum()).distributed(link_options()),
      groups);
  load_checkpoint(w.file("pipedream-ckpt"), resumed.runner());
  const Data next = global_batch(kSteps);
  pipe.train_step(next.x, next.y, mse);
  resumed.train_step(next.x, next.y, mse);
  write_tensors(w.file("pipedream-next"), values_of(pipe.named_parameters()));
  write_tensors(w.file("pipedream-resumed"), values_of(resumed.named_parameters()));
  groups->barrier();
}

// D = 2 replicas of a 2-stage pipeline, each on its shard of the global batch.
inline void hybrid(Worker& w) {
  auto groups = w.groups("hybrid", 2, std::chrono::seconds(20));
  const int d = groups->replica(), replicas = groups->layout().replicas;
  auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); };
  DistributedRunner pipe(seeded_mlp(), PipelineOptions().microbatches(2).schedule("1f1b").optimizer(sgd).distributed(link_options()), groups);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    losses.push_back(pipe.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse).loss);
  }
  write_tensors(w.file("hybrid"), values_of(pipe.named_parameters()));
  pipe.gather_model();
  if (pipe.is_logging_rank()) {
    TensorMap whole = values_of(pipe.model());
    whole["losses"] = torch::tensor(losses, at::kDouble);
    write_tensors(w.out + "/hybrid-gathered.pt", whole);
  }
  // An asynchronous schedule reduces across replicas at every update; with
  // the same data on both replicas it must equal one pipeline.
  DistributedRunner async(
      seeded_mlp(), PipelineOptions().microbatches(kMicrobatches).schedule("pipedream").optimizer(sgd_momentum()).distributed(link_options()),
      groups);
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    async.train_step(s.x, s.y, mse);
  }
  write_tensors(w.file("hybrid-pipedream"), values_of(async.named_parameters()));
  groups->barrier();
}

// The data-parallel baseline: every rank the whole model, gradients all-reduced.
inline void data_parallel(Worker& w) {
  auto groups = w.groups("ddp", 1, std::chrono::seconds(20));
  auto model = seeded_mlp();
  AllReduceDataParallel ddp(model, std::make_unique<torch::optim::SGD>(model->parameters(), 0.1), groups);
  const int d = groups->replica(), replicas = groups->layout().replicas;
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    ddp.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
  }
  write_tensors(w.file("ddp"), values_of(model));
  groups->barrier();
}

// The same 1F1B step with the sent outputs released (the default) and kept:
// each rank's gradients and its stages' peak stash bytes, for 3 steps.
inline void released_sends(Worker& w) {
  auto groups = w.groups("released", w.env.world_size, std::chrono::seconds(20));
  for (const bool release : {true, false}) {
    DistributedRunner pipe(seeded_mlp(), PipelineOptions(synchronous_case("1f1b").free_sent_activations(release)).distributed(link_options()), groups);
    const Data d = global_batch(0);
    const StepResult r = pipe.train_step(d.x, d.y, mse);
    TensorMap out = grads_of(pipe.named_parameters());
    out["peak_stash"] = torch::tensor(r.peak_stash_bytes, torch::kLong);
    out["peak_inflight"] = torch::tensor(std::vector<int64_t>(r.peak_inflight.begin(), r.peak_inflight.end()),
                                         torch::kLong);
    write_tensors(w.file(release ? "released" : "kept"), out);
  }
  groups->barrier();
}

// Stage 1 declares an activation shape stage 0 does not produce.
inline void declared_shape_mismatch(Worker& w) {
  const std::chrono::milliseconds timeout(1000);
  auto groups = w.groups("mismatch", w.env.world_size, timeout);
  try {
    DistributedRunner pipe(seeded_mlp(),
                           PipelineOptions()
                               .microbatches(2)
                               .schedule("gpipe")
                               .timeout(timeout)
                               .distributed(link_options())
                               .activation_shapes({{-1, 7}}),
                           groups);
    const Data d = global_batch(0);
    pipe.train_step(d.x, d.y, mse);
    w.note("mismatch", "no error");
  } catch (const std::exception& e) {
    w.note("mismatch", e.what());
  }
}

// A 3-stage pipeline whose stage 1 holds a tripwire (see TripwireImpl).
inline void faulty(Worker& w) {
  const std::chrono::milliseconds timeout(std::stoi(std::getenv("CONVEYOR_TEST_TIMEOUT_MS")));
  auto groups = w.groups("faulty", 3, timeout);
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(), Tripwire(), torch::nn::Linear(16, 8),
                              torch::nn::Tanh(), torch::nn::Linear(8, 3));
  model->to(torch::kFloat64);
  DistributedRunner pipe(
      model, PipelineOptions().boundaries({2, 5}).microbatches(kMicrobatches).schedule("1f1b").timeout(timeout).distributed(link_options()),
      groups);
  for (int step = 0; step < 2; ++step) {
    const Data d = global_batch(step);
    pipe.train_step(d.x, d.y, mse);
  }
}

// ---------------------------------------------------------------------------
// Training options over processes: K = 2 workers, and D = world / 2 replicas.

// Clipping by global norm: the norm over the whole model, across the pipeline's
// processes and (after averaging) the replicas.
inline PipelineOptions clipped_options() {
  return PipelineOptions().microbatches(2).schedule("1f1b").clip_grad_norm(0.05).optimizer(sgd_momentum());
}

// Linear, bomb, Tanh | Linear, Tanh, Linear: the bomb overflows worker 0's
// gradients only, and only on replica 0.
inline torch::nn::Sequential bomb_model(const std::shared_ptr<double>& factor) {
  torch::manual_seed(0);
  torch::nn::Sequential m(torch::nn::Linear(8, 16), GradBomb(factor), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                          torch::nn::Tanh(), torch::nn::Linear(16, 3));
  m->to(torch::kFloat64);
  return m;
}
inline PipelineOptions scaled_options() {
  return PipelineOptions().boundaries({3}).microbatches(2).schedule("gpipe").optimizer(sgd_momentum()).loss_scaling(
      LossScaling().init_scale(1024).growth_interval(2));
}
constexpr int kOverflowStep = 1;
inline torch::nn::Sequential seeded_fp32_mlp() {
  auto m = seeded_mlp();
  m->to(torch::kFloat32);
  return m;
}
inline PipelineOptions autocast_options() {
  return PipelineOptions().microbatches(2).schedule("1f1b").autocast(at::kBFloat16);
}

inline void training_options(Worker& w) {
  auto groups = w.groups("training-options", 2, std::chrono::seconds(20));
  const int d = groups->replica(), replicas = groups->layout().replicas;
  DistributedRunner clipped(seeded_mlp(), PipelineOptions(clipped_options()).distributed(link_options()), groups);
  std::vector<double> norms;
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    norms.push_back(clipped.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse).grad_norm);
  }
  TensorMap clip = values_of(clipped.named_parameters());
  clip["norms"] = torch::tensor(norms, at::kDouble);
  write_tensors(w.file("clip"), clip);

  auto factor = std::make_shared<double>(1.0);
  DistributedRunner scaled(bomb_model(factor), PipelineOptions(scaled_options()).distributed(link_options()), groups);
  std::vector<double> scales, skipped;
  for (int step = 0; step < kSteps + 1; ++step) {
    *factor = step == kOverflowStep && w.env.rank == 0 ? std::numeric_limits<double>::infinity() : 1.0;
    const Data s = global_batch(step);
    const StepResult r = scaled.train_step(shard(s.x, d, replicas), shard(s.y, d, replicas), mse);
    scales.push_back(r.loss_scale);
    skipped.push_back(r.skipped_updates);
  }
  if (replicas == 1) {  // bf16 autocast over c10d: the activations and gradients cross in bf16
    DistributedRunner bf16(seeded_fp32_mlp(), PipelineOptions(autocast_options()).distributed(link_options()), groups);
    const Data s = global_batch(0);
    const StepResult r = bf16.train_step(s.x.to(torch::kFloat32), s.y.to(torch::kFloat32), mse);
    TensorMap grads = grads_of(bf16.named_parameters());
    grads["loss"] = at::full({1}, r.loss, at::kDouble);
    write_tensors(w.file("bf16"), grads);
  }
  TensorMap scaler = values_of(scaled.named_parameters());
  scaler["scales"] = torch::tensor(scales, at::kDouble);
  scaler["skipped"] = torch::tensor(skipped, at::kDouble);
  write_tensors(w.file("scaler"), scaler);
  groups->barrier();
}

// A rank's life in every multi-process test binary: its launch environment
// and the job's store, then `role`; exit status 1, the error printed, if it throws.
inline int run_rank(const std::function<void(Worker&)>& role) {
  torch::set_num_threads(1);
  Worker w;
  try {
    w.env = LaunchEnvironment::from_environment();
    w.out = std::getenv("CONVEYOR_TEST_OUT");
    w.store = connect_store(w.env, std::chrono::seconds(30));
    role(w);
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace conveyor::testing
