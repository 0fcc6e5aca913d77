#include "examples/distributed/distributed_args.h"

#include <charconv>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

namespace conveyor::examples {

const char* const kHelp = R"(distributed_train: train one model by pipeline, hybrid or data parallelism.

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
  --lr X              learning rate (default 0.05)
  --optimizer NAME    sgd (default) | adam
  --shard LEVEL       pipeline with replicas: none (default) | optimizer (each
                      replica keeps 1/D of the optimizer's state, ZeRO-1) |
                      gradients (and of the reduced gradients, ZeRO-2) |
                      parameters (and of the weights, ZeRO-3); rank 0 prints
                      every rank's optimizer bytes and the median step
  --shard-optimizer   --shard optimizer
  --scale-lr          multiply the learning rate by the replicas (linear scaling)
  --predict           pipeline, one replica: rank 0 profiles the model and the
                      link first and prints the planner's predicted step
                      beside the measured median (steps after the first)
  --keep-sent         pipeline: a stage keeps its outputs' data after sending
                      them (by default it releases it, keeping their graph);
                      rank 0 prints its stages' peak stash either way
  --no-shared-memory  pipeline: neighbouring processes on this machine pass
                      activations and gradients over Gloo's sockets (by
                      default they use shared memory, other machines Gloo)
  --model NAME        mlp (default) | lm
  --hidden N, --layers N, --inputs N, --classes N   model size (512, 6, 256, 10)
  --vocab N, --embed N, --length N   the lm's words, embedding, tokens (2000, 64, 20)
  --threads N         intra-op threads per process (default 1)
  --timeout-ms N      bound on every wait for another process (default 60000);
                      a dead or stalled peer stops every rank within it
  --checkpoint PATH   at the end rank 0 writes the whole model there (atomically)
  --state-dict PATH   pipeline: at the end rank 0 writes the trained model as a
                      {name: tensor} dict that torch.load reads
  --save-every N      pipeline: every N steps each rank checkpoints its stages
                      to --run-dir (keeping the previous checkpoint too)
  --run-dir DIR       where --save-every writes and --resume reads
  --resume auto       pipeline: start from the newest step every rank has a
                      checkpoint of in --run-dir (none: from the start); with
                      torchrun --max-restarts=N a run survives a lost rank;
                      a job of another size (--workers, --replicas) resumes
                      from every rank's files, resharded
  --seed N            seed of the model and the data (default 1)
  --log-every N       steps between log lines (default 10)
  --help              this text

Logging, checkpointing and evaluation happen on rank 0 only. The last line
rank 0 prints is "samples/s: X" over the steps after the first.
)";

namespace {

template <typename T>
T number(const std::string& flag, const std::string& text) {
  T value{};
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    throw std::invalid_argument("--" + flag + " needs a number, got '" + text + "'");
  }
  return value;
}

}  // namespace

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
    // Each switch sets its flag to the value given here.
    const std::map<std::string, std::pair<bool*, bool>> switches = {{"scale-lr", {&a.scale_lr, true}},
                                                                    {"predict", {&a.predict, true}},
                                                                    {"keep-sent", {&a.keep_sent, true}},
                                                                    {"shared-memory", {&a.shared_memory, true}},
                                                                    {"no-shared-memory", {&a.shared_memory, false}}};
    if (const auto it = switches.find(flag); it != switches.end()) {
      *it->second.first = it->second.second;
      continue;
    }
    if (flag == "shard-optimizer") {
      a.shard = conveyor::ShardLevel::kOptimizer;
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
        {"threads", &a.threads},        {"log-every", &a.log_every},   {"lookahead", &a.lookahead},
        {"save-every", &a.save_every}};
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
    } else if (flag == "shard") {
      a.shard = conveyor::schedules::shard_level_named(value);  // names the levels when it is none of them
    } else if (flag == "schedule") {
      a.schedule = value;
    } else if (flag == "model") {
      if (value != "mlp" && value != "lm") {
        throw std::invalid_argument("--model must be mlp or lm, got '" + value + "'");
      }
      a.model.kind = value;
    } else if (flag == "checkpoint") {
      a.checkpoint = value;
    } else if (flag == "state-dict") {
      a.state_dict = value;
    } else if (flag == "run-dir") {
      a.run_dir = value;
    } else if (flag == "optimizer") {
      if (value != "sgd" && value != "adam") {
        throw std::invalid_argument("--optimizer must be sgd or adam, got '" + value + "'");
      }
      a.optimizer = value;
    } else if (flag == "resume") {
      if (value != "auto" && value != "never") {
        throw std::invalid_argument("--resume must be auto or never, got '" + value + "'");
      }
      a.resume = value == "auto";
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
  if ((a.save_every > 0 || a.resume) && a.run_dir.empty()) {
    throw std::invalid_argument("--save-every and --resume auto need --run-dir, where the checkpoints are");
  }
  return a;
}

}  // namespace conveyor::examples
