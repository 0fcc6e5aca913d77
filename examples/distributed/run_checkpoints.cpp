#include "examples/distributed/run_checkpoints.h"

#include "plugin/checkpoint/checkpoint.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>
#include <regex>

namespace conveyor::examples {

namespace fs = std::filesystem;

std::string RunCheckpoints::file(int64_t step) const {
  return dir_ + "/step" + std::to_string(step) + "-rank" + std::to_string(rank_) + ".ckpt";
}

int64_t RunCheckpoints::resume(DistributedPipeline& pipe) {
  // This rank's newest file; a rank that died while writing has only the
  // one before (files are renamed into place whole), so the job resumes from
  // the smallest newest step, which every rank has kept.
  int64_t newest = 0;
  if (every_ > 0 && fs::is_directory(dir_)) {
    const std::regex name("step([0-9]+)-rank" + std::to_string(rank_) + "\\.ckpt");
    for (const auto& entry : fs::directory_iterator(dir_)) {
      std::smatch m;
      const std::string base = entry.path().filename().string();
      if (std::regex_match(base, m, name)) newest = std::max<int64_t>(newest, std::stoll(m[1]));
    }
  }
  at::Tensor step = at::full({1}, -static_cast<double>(newest), at::kDouble);  // the minimum, as a max of negatives
  all_reduce_values(pipe.groups(), pipe.groups().world() ? *pipe.groups().world() : *pipe.groups().pipeline(), step,
                    /*max=*/true, "agreeing on the step to resume from");
  if (!pipe.groups().world() && pipe.groups().replicas()) {
    all_reduce_values(pipe.groups(), *pipe.groups().replicas(), step, true, "agreeing on the step to resume from");
  }
  const auto start = static_cast<int64_t>(-step.item<double>());
  if (start == 0) return 0;
  const int64_t saved = load_checkpoint(file(start), pipe.pipeline());
  if (pipe.is_logging_rank()) std::cout << "resumed from step " << saved << " (" << dir_ << ")\n";
  return saved;
}

void RunCheckpoints::after_step(DistributedPipeline& pipe, int64_t steps) {
  if (every_ <= 0 || steps % every_ != 0) return;
  fs::create_directories(dir_);
  save_checkpoint(file(steps), pipe.pipeline(), {steps, {}});
  std::error_code ignored;
  fs::remove(file(steps - 2 * every_), ignored);
}

}  // namespace conveyor::examples
