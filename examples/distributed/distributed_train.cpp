// distributed_train: one model, three ways to spread its training over
// processes or devices (a pipeline with one stage per process and optional
// data-parallel replicas of it; all-reduce data parallelism over c10d; and
// LibTorch's single-process DataParallel), so they can be compared on the
// same work. Run with --help.

#include "examples/distributed/distributed_args.h"
#include "examples/distributed/distributed_models.h"
#include "examples/distributed/run_checkpoints.h"
#include "plugin/conveyor.h"
#include "plugin/checkpoint/model_state.h"
#include "plugin/distributed/distributed_runner.h"
#include "plugin/pipeline.h"
#include "plugin/support/atomic_file.h"
#include "plugin/support/timing.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {


using conveyor::examples::Args;
using conveyor::examples::Batch;
using conveyor::examples::cross_entropy;


torch::nn::Sequential make_model(const Args& a) { return conveyor::examples::make_model(a.model); }
Batch global_batch(const Args& a, int64_t step) { return conveyor::examples::global_batch(a.model, step); }
void evaluate(const Args& a, torch::nn::Sequential model) { conveyor::examples::evaluate(a.model, model); }

void save(const std::string& path, const torch::nn::Sequential& model) {
  conveyor::write_atomically(path, [&](std::ostream& out) { torch::save(model, out); });
  std::cout << "saved " << path << "\n";
}

// Times steps after the first (which pays for warm-up and connections).
class Meter {
 public:
  void step_done(int step, int samples) {
    const auto now = std::chrono::steady_clock::now();
    if (step == 0) {
      start_ = now;
    } else {
      samples_ += samples;
    }
    last_ = now;
  }
  double samples_per_second() const {
    const double s = std::chrono::duration<double>(last_ - start_).count();
    return s > 0 ? samples_ / s : 0;
  }

 private:
  std::chrono::steady_clock::time_point start_, last_;
  double samples_ = 0;
};

void log_step(const Args& a, int step, double loss) {
  if (step % a.log_every == 0 || step + 1 == a.steps) {
    std::cout << "step " << std::setw(5) << step << "  loss " << std::fixed << std::setprecision(4) << loss
              << std::defaultfloat << "\n";
  }
}

int run_pipeline(const Args& a, const conveyor::LaunchEnvironment& env) {
  const int workers = a.workers > 0 ? a.workers : env.world_size / a.replicas;
  if (workers * a.replicas != env.world_size) {
    throw std::invalid_argument("WORLD_SIZE=" + std::to_string(env.world_size) + " is not --workers (" +
                                std::to_string(workers) + ") x --replicas (" + std::to_string(a.replicas) + ")");
  }
  const std::chrono::milliseconds timeout(a.timeout_ms);
  conveyor::ProcessGroups::Options group_options;
  group_options.timeout = timeout;
  auto groups = std::make_shared<conveyor::ProcessGroups>(
      conveyor::connect_store(env, std::chrono::minutes(5)), env.rank,
      conveyor::HybridLayout::for_world(env.world_size, workers), group_options);
  const double lr = a.lr;
  const bool adam = a.optimizer == "adam";
  auto options = conveyor::PipelineOptions()
                     .workers(workers)
                     .microbatches(a.microbatches)
                     .schedule(a.schedule)
                     .lookahead(a.lookahead)
                     .timeout(timeout)
                     .trace(false)
                     .free_sent_activations(!a.keep_sent)
                     .optimizer([lr, adam](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
                       if (adam) return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(lr));
                       return std::make_unique<torch::optim::SGD>(p, lr);
                     });
  std::optional<conveyor::Prediction> plan;  // --predict: on rank 0, before the others connect (they wait)
  if (a.predict && a.replicas != 1) throw std::invalid_argument("--predict prices a pipeline of one replica");
  if (a.predict && env.rank == 0) plan = conveyor::examples::predict_c10d_step(a.model, options, a.shared_memory);
  conveyor::Pipeline pipe(make_model(a),
                          options.scale_learning_rate(a.scale_lr)
                              .local_rank(env.local_rank)
                              .shard(a.shard)
                              .shared_memory(a.shared_memory),
                          groups);
  conveyor::examples::RunCheckpoints checkpoints(a.run_dir, a.save_every, env.rank, env.world_size);
  const int first = a.resume ? static_cast<int>(checkpoints.resume(pipe)) : 0;
  if (pipe.is_logging_rank()) {
    std::cout << "pipeline: " << workers << " workers x " << a.replicas << " replicas, schedule " << a.schedule << ", "
              << a.microbatches << " micro-batches, learning rate " << pipe.learning_rate(lr) << "\n";
  }
  const int d = groups->replica();
  Meter meter;
  std::vector<double> wall;  // per step after the first
  int64_t peak_stash = 0;    // this rank's stages' stashes, summed, at their peak
  for (int step = first; step < a.steps; ++step) {
    const Batch b = global_batch(a, step);
    const auto r =
        pipe.train_step(conveyor::shard(b.x, d, a.replicas), conveyor::shard(b.y, d, a.replicas), cross_entropy);
    checkpoints.after_step(pipe, step + 1);
    meter.step_done(step - first, a.model.batch);
    if (step > first) wall.push_back(r.wall_seconds);
    int64_t stash = 0;
    for (int64_t bytes : r.peak_stash_bytes) stash += bytes;
    peak_stash = std::max(peak_stash, stash);
    if (pipe.is_logging_rank()) log_step(a, step, r.loss);
  }
  // Every rank's optimizer bytes, in rank order, on every rank.
  at::Tensor state_bytes = at::zeros({env.world_size}, at::kDouble);
  state_bytes[env.rank] = static_cast<double>(pipe.optimizer_state_bytes());
  conveyor::all_reduce_everywhere(*groups, {state_bytes}, "gathering the optimizer bytes per rank");
  conveyor::DistributedRunner& ranks = *pipe.distributed();  // this process's part, across processes
  ranks.gather_model();
  if (pipe.is_logging_rank()) {
    evaluate(a, ranks.model());
    if (!a.checkpoint.empty()) save(a.checkpoint, ranks.model());
    if (!a.state_dict.empty()) conveyor::save_model_state(a.state_dict, *ranks.model());
    std::cout << "optimizer state per rank (shard " << conveyor::value_name(a.shard) << "):";
    for (int r = 0; r < env.world_size; ++r) std::cout << " " << static_cast<int64_t>(state_bytes[r].item<double>());
    std::cout << " bytes\nmedian step " << conveyor::median(wall) * 1e3 << " ms\n";
    if (plan) {
      const double measured = conveyor::median(wall), predicted = plan->step_seconds();
      std::cout << "predicted step " << predicted * 1e3 << " ms, measured (median) " << measured * 1e3
                << " ms: error " << std::showpos << 100 * (predicted / measured - 1) << std::noshowpos << "%\n";
    }
    std::cout << "peak stash on rank 0: " << peak_stash << " bytes ("
              << (a.keep_sent ? "sent outputs kept" : "sent outputs released") << ")\n";
    std::cout << "samples/s: " << meter.samples_per_second() << "\n";
  }
  groups->barrier();
  return 0;
}

// The pipeline of run_pipeline in one process, a thread per worker.
int run_threads(const Args& a, const conveyor::LaunchEnvironment& env) {
  if (env.world_size != 1) throw std::invalid_argument("--parallel=threads is one process; run it without torchrun");
  const double lr = a.lr;
  conveyor::Pipeline pipe(make_model(a), conveyor::PipelineOptions()
                                             .workers(a.workers > 0 ? a.workers : 2)
                                             .microbatches(a.microbatches)
                                             .schedule(a.schedule)
                                             .lookahead(a.lookahead)
                                             .trace(false)
                                             .optimizer([lr](std::vector<at::Tensor> p) {
                                               return std::make_unique<torch::optim::SGD>(p, lr);
                                             }));
  std::cout << "threads: " << pipe.num_workers() << " workers in one process, schedule " << a.schedule << ", "
            << a.microbatches << " micro-batches\n";
  Meter meter;
  for (int step = 0; step < a.steps; ++step) {
    const Batch b = global_batch(a, step);
    const auto r = pipe.train_step(b.x, b.y, cross_entropy);
    meter.step_done(step, a.model.batch);
    log_step(a, step, r.loss);
  }
  std::cout << "samples/s: " << meter.samples_per_second() << "\n";
  return 0;
}

int run_ddp(const Args& a, const conveyor::LaunchEnvironment& env) {
  conveyor::ProcessGroups::Options group_options;
  group_options.timeout = std::chrono::milliseconds(a.timeout_ms);
  auto groups =
      std::make_shared<conveyor::ProcessGroups>(conveyor::connect_store(env, std::chrono::minutes(5)), env.rank,
                                                conveyor::HybridLayout::for_world(env.world_size, 1), group_options);
  const int replicas = env.world_size, d = groups->replica();
  const double lr = a.scale_lr ? a.lr * replicas : a.lr;
  auto model = make_model(a);
  conveyor::AllReduceDataParallel ddp(model, std::make_unique<torch::optim::SGD>(model->parameters(), lr), groups);
  if (ddp.is_logging_rank()) std::cout << "ddp: " << replicas << " processes, learning rate " << lr << "\n";
  Meter meter;
  for (int step = 0; step < a.steps; ++step) {
    const Batch b = global_batch(a, step);
    const double loss =
        ddp.train_step(conveyor::shard(b.x, d, replicas), conveyor::shard(b.y, d, replicas), cross_entropy);
    meter.step_done(step, a.model.batch);
    if (ddp.is_logging_rank()) log_step(a, step, loss);
  }
  if (ddp.is_logging_rank()) {
    evaluate(a, model);
    if (!a.checkpoint.empty()) save(a.checkpoint, model);
    std::cout << "samples/s: " << meter.samples_per_second() << "\n";
  }
  groups->barrier();
  return 0;
}

int run_data_parallel(const Args& a, const conveyor::LaunchEnvironment& env) {
  if (env.world_size != 1) {
    throw std::invalid_argument(
        "--parallel=dataparallel is one process driving every device; run it without "
        "torchrun (or with --nproc-per-node=1)");
  }
  std::vector<c10::Device> devices;
  for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) devices.emplace_back(torch::kCUDA, i);
  if (devices.empty()) devices.emplace_back(torch::kCPU);
  std::cout << "dataparallel: " << devices.size() << " device(s)"
            << (devices[0].is_cpu() ? " (the CPU is one device: this is plain single-process training)" : "") << "\n";
  auto model = make_model(a);
  model->to(devices[0]);
  torch::optim::SGD sgd(model->parameters(), a.lr);
  Meter meter;
  for (int step = 0; step < a.steps; ++step) {
    const Batch b = global_batch(a, step);
    const double loss = conveyor::data_parallel_step(model, sgd, b.x, b.y, cross_entropy, devices);
    meter.step_done(step, a.model.batch);
    log_step(a, step, loss);
  }
  model->to(torch::kCPU);
  evaluate(a, model);
  if (!a.checkpoint.empty()) save(a.checkpoint, model);
  std::cout << "samples/s: " << meter.samples_per_second() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0;
  try {
    const Args a = conveyor::examples::parse(argc, argv);
    torch::set_num_threads(a.threads);
    const auto env = conveyor::LaunchEnvironment::from_environment();
    rank = env.rank;
    if (a.parallel == "pipeline") return run_pipeline(a, env);
    if (a.parallel == "ddp") return run_ddp(a, env);
    if (a.parallel == "threads") return run_threads(a, env);
    return run_data_parallel(a, env);
  } catch (const std::exception& e) {
    std::cerr << "distributed_train: rank " << rank << ": " << e.what() << std::endl;
    return 1;
  }
}
