#pragma once
// distributed_train's flags (--help prints them).

#include "examples/distributed/distributed_models.h"
#include "plugin/distributed/distributed_runner.h"

#include <string>

namespace conveyor::examples {

struct Args {
  std::string parallel = "pipeline", schedule = "1f1b", checkpoint;
  int workers = 0, replicas = 1, microbatches = 4, steps = 50, threads = 1, log_every = 10, lookahead = 0;
  int64_t timeout_ms = 60000;
  double lr = 0.05;
  bool scale_lr = false, predict = false, keep_sent = false;
  bool shared_memory = conveyor::DistributedOptions().shared_memory;  // --no-shared-memory: false
  std::string optimizer = "sgd";  // sgd | adam
  conveyor::ShardLevel shard = conveyor::ShardLevel::kNone;  // across the replicas (--shard)
  std::string run_dir;            // --save-every's checkpoints
  int save_every = 0;
  bool resume = false;            // --resume auto
  std::string state_dict;         // rank 0 writes the trained model's {name: tensor} there
  conveyor::examples::DistributedModel model;
};

extern const char* const kHelp;

// Throws std::invalid_argument naming a bad flag; exits after --help.
Args parse(int argc, char** argv);

}  // namespace conveyor::examples
