// distributed_train: one model, three ways to spread its training over
// processes or devices (a pipeline with one stage per process and optional
// data-parallel replicas of it; all-reduce data parallelism over c10d; and
// LibTorch's single-process DataParallel), so they can be compared on the
// same work. Run with --help.

#include "examples/distributed/distributed_models.h"
#include "plugin/conveyor.h"
#include "plugin/distributed/distributed_pipeline.h"
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

constexpr const char* kHelp = R"(distributed_train: train one model by pipeline, hybrid or data parallelism.

Launch with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT), one process per worker (a worker runs one or more stages):

  torchrun --nproc-per-node=2 --no-python ./distributed_train --parallel=pipeline --workers=2
  torchrun --nproc-per-node=4 --no-python ./distributed_train --parallel=pipeline --workers=2 --replicas=2
  torchrun --nproc-per-node=2 --no-python ./distributed_train --parallel=ddp
  ./distributed_train --parallel=dataparallel

A multi-node torchrun (--nnodes, --rdzv-endpoint) works unchanged; without
torchrun the program is one process, rank 0 of 1.

Model and data: an MLP of --layers hidden layers of --hidden units (ReLU)
classifying --inputs features into --classes classes, trained with SGD on the
mean cross-entropy. The data are synthetic and endless: step s draws a global
batch of --batch samples from a generator seeded with --seed + s, labelled by a
fixed random linear teacher, so every rank can draw the same batch and each
replica trains on its own shard of it. With --model=lm: the demo's LSTM
language model (embedding --embed, two LSTMs of --hidden, dropout 0) on
--batch sequences of --length tokens drawn from --vocab words, each target a
fixed function of its token.

Modes (--parallel):
  pipeline      the layers cut into stages run by --workers processes (one
                stage each, two under an interleaved schedule), under
                --schedule with --microbatches micro-batches; WORLD_SIZE must be
                workers x replicas, rank r is worker r % workers of replica
                r / workers. Replicas average their gradients every step.
  ddp           every process holds the whole model and trains it on its shard;
                gradients are averaged over all processes (c10d all-reduce).
  threads       the same pipeline in one process, a thread per worker
                (--workers, default 2); run it without torchrun.
  dataparallel  LibTorch's torch::nn::parallel::data_parallel in one process,
                over every CUDA device; on the CPU there is one device, so it is
                plain single-process training (the baseline). One process only.

Flags (--flag=VALUE or --flag VALUE):
  --parallel MODE     pipeline | ddp | dataparallel (default pipeline)
  --workers N         pipeline workers (default: WORLD_SIZE / --replicas)
  --replicas N        data-parallel replicas of the pipeline (default 1)
  --microbatches N    micro-batches per replica batch (default 4)
  --schedule NAME     gpipe | 1f1b | eager-1f1b | zb-h1 | interleaved |
                      zb-interleaved | sequential | pipedream | ddg | fr
                      (default 1f1b; the interleaved ones run two chunks of the
                      model per process)
  --lookahead N       eager-1f1b's forwards ahead per later stage (default 1)
  --steps N           training steps (default 50)
  --batch N           global batch, divided among the replicas (default 256)
  --lr X              SGD learning rate (default 0.05)
  --scale-lr          multiply the learning rate by the replicas (linear scaling)
  --predict           pipeline, one replica: rank 0 profiles the model and the
                      Gloo link first and prints the planner's predicted step
                      beside the measured median (steps after the first)
  --keep-sent         pipeline: a stage keeps its outputs' data after sending
                      them (by default it releases it, keeping their graph);
                      rank 0 prints its stages' peak stash either way
  --model NAME        mlp (default) | lm
  --hidden N, --layers N, --inputs N, --classes N   model size (512, 6, 256, 10)
  --vocab N, --embed N, --length N   the lm's words, embedding, tokens (2000, 64, 20)
  --threads N         intra-op threads per process (default 1)
  --timeout-ms N      bound on every wait for another process (default 60000);
                      a dead or stalled peer stops every rank within it
  --checkpoint PATH   at the end rank 0 writes the whole model there (atomically)
  --seed N            seed of the model and the data (default 1)
  --log-every N       steps between log lines (default 10)
  --help              this text

Logging, checkpointing and evaluation happen on rank 0 only. The last line
rank 0 prints is "samples/s: X" over the steps after the first.
)";

using conveyor::examples::Batch;
using conveyor::examples::cross_entropy;

struct Args {
  std::string parallel = "pipeline", schedule = "1f1b", checkpoint;
  int workers = 0, replicas = 1, microbatches = 4, steps = 50, threads = 1, log_every = 10, lookahead = 0;
  int64_t timeout_ms = 60000;
  double lr = 0.05;
  bool scale_lr = false, predict = false, keep_sent = false;
  conveyor::examples::DistributedModel model;
};

torch::nn::Sequential make_model(const Args& a) { return conveyor::examples::make_model(a.model); }
Batch global_batch(const Args& a, int64_t step) { return conveyor::examples::global_batch(a.model, step); }
void evaluate(const Args& a, torch::nn::Sequential model) { conveyor::examples::evaluate(a.model, model); }

template <typename T>
T number(const std::string& flag, const std::string& text) {
  T value{};
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw std::invalid_argument("--" + flag + " needs a number, got '" + text + "'");
  }
  return value;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::cout << kHelp;
      std::exit(0);
    }
    if (flag.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + flag + "' (see --help)");
    flag = flag.substr(2);
    if (flag == "scale-lr" || flag == "predict" || flag == "keep-sent") {
      (flag == "predict" ? a.predict : flag == "keep-sent" ? a.keep_sent : a.scale_lr) = true;
      continue;
    }
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw std::invalid_argument("--" + flag + " needs a value");
    }
    const std::map<std::string, int*> ints = {
        {"workers", &a.workers},        {"replicas", &a.replicas},     {"microbatches", &a.microbatches},
        {"steps", &a.steps},            {"batch", &a.model.batch},     {"hidden", &a.model.hidden},
        {"layers", &a.model.layers},    {"inputs", &a.model.inputs},   {"classes", &a.model.classes},
        {"vocab", &a.model.vocab},      {"embed", &a.model.embed},     {"length", &a.model.length},
        {"threads", &a.threads},        {"log-every", &a.log_every},   {"lookahead", &a.lookahead}};
    if (const auto it = ints.find(flag); it != ints.end()) {
      *it->second = number<int>(flag, value);
      if (*it->second < (flag == "workers" || flag == "lookahead" ? 0 : 1)) {
        throw std::invalid_argument("--" + flag + " must be positive");
      }
    } else if (flag == "stages") {
      throw std::invalid_argument("--stages is now --workers: a stage is a piece of the model, a worker the process "
                                  "that runs one or more stages");
    } else if (flag == "parallel") {
      if (value != "pipeline" && value != "threads" && value != "ddp" && value != "dataparallel") {
        throw std::invalid_argument("--parallel must be pipeline, threads, ddp or dataparallel, got '" + value + "'");
      }
      a.parallel = value;
    } else if (flag == "schedule") {
      a.schedule = value;
    } else if (flag == "model") {
      if (value != "mlp" && value != "lm") {
        throw std::invalid_argument("--model must be mlp or lm, got '" + value + "'");
      }
      a.model.kind = value;
    } else if (flag == "checkpoint") {
      a.checkpoint = value;
    } else if (flag == "timeout-ms") {
      a.timeout_ms = number<int64_t>(flag, value);
      if (a.timeout_ms <= 0) throw std::invalid_argument("--timeout-ms must be positive");
    } else if (flag == "seed") {
      a.model.seed = number<int64_t>(flag, value);
    } else if (flag == "lr") {
      a.lr = std::stod(value);
    } else {
      throw std::invalid_argument("unknown flag --" + flag + " (see --help)");
    }
  }
  return a;
}

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
  auto options = conveyor::PipelineOptions()
                     .workers(workers)
                     .microbatches(a.microbatches)
                     .schedule(a.schedule)
                     .lookahead(a.lookahead)
                     .timeout(timeout)
                     .trace(false)
                     .free_sent_activations(!a.keep_sent)
                     .optimizer([lr](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, lr); });
  std::optional<conveyor::Plan> plan;  // --predict: on rank 0, before the others connect (they wait)
  if (a.predict && a.replicas != 1) throw std::invalid_argument("--predict prices a pipeline of one replica");
  if (a.predict && env.rank == 0) plan = conveyor::examples::predict_c10d_step(a.model, options);
  conveyor::DistributedPipeline pipe(
      make_model(a), options, groups,
      conveyor::DistributedOptions().scale_learning_rate(a.scale_lr).local_rank(env.local_rank));
  if (pipe.is_logging_rank()) {
    std::cout << "pipeline: " << workers << " workers x " << a.replicas << " replicas, schedule " << a.schedule << ", "
              << a.microbatches << " micro-batches, learning rate " << pipe.learning_rate(lr) << "\n";
  }
  const int d = groups->replica();
  Meter meter;
  std::vector<double> wall;  // per step after the first
  int64_t peak_stash = 0;    // this rank's stages' stashes, summed, at their peak
  for (int step = 0; step < a.steps; ++step) {
    const Batch b = global_batch(a, step);
    const auto r =
        pipe.train_step(conveyor::shard(b.x, d, a.replicas), conveyor::shard(b.y, d, a.replicas), cross_entropy);
    meter.step_done(step, a.model.batch);
    if (step > 0) wall.push_back(r.wall_seconds);
    int64_t stash = 0;
    for (int64_t bytes : r.peak_stash_bytes) stash += bytes;
    peak_stash = std::max(peak_stash, stash);
    if (pipe.is_logging_rank()) log_step(a, step, r.loss);
  }
  pipe.gather_model();
  if (pipe.is_logging_rank()) {
    evaluate(a, pipe.model());
    if (!a.checkpoint.empty()) save(a.checkpoint, pipe.model());
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
    const Args a = parse(argc, argv);
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
