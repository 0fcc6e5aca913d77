#include "examples/distributed/run_checkpoints.h"

#include "plugin/checkpoint/checkpoint.h"
#include "plugin/distributed/distributed_runner.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <utility>
#include <vector>

namespace conveyor::examples {

namespace fs = std::filesystem;

std::string RunCheckpoints::file(int64_t step, int rank, int world) const {
  return dir_ + "/step" + std::to_string(step) + "-rank" + std::to_string(rank) + "-of" + std::to_string(world) +
         ".ckpt";
}

int64_t RunCheckpoints::resume(Pipeline& pipe) {
  ProcessGroups& groups = pipe.distributed()->groups();
  // The newest step whose files are all there (as many as the job that wrote
  // them had ranks): a rank that died while writing left only the one
  // before (files are renamed into place whole). The ranks agree on the
  // smallest they found, in case they do not see the same directory.
  std::map<int64_t, std::pair<int, std::set<int>>> steps;  // step: the writers' world size, the ranks there
  if (every_ > 0 && fs::is_directory(dir_)) {
    const std::regex name("step([0-9]+)-rank([0-9]+)-of([0-9]+)\\.ckpt");
    for (const auto& entry : fs::directory_iterator(dir_)) {
      std::smatch m;
      const std::string base = entry.path().filename().string();
      if (!std::regex_match(base, m, name)) continue;
      auto& [world, ranks] = steps[std::stoll(m[1])];
      world = std::stoi(m[3]);
      ranks.insert(std::stoi(m[2]));
    }
  }
  int64_t newest = 0;
  for (const auto& [step, seen] : steps) {
    if (static_cast<int>(seen.second.size()) == seen.first) newest = step;
  }
  at::Tensor step = at::full({1}, -static_cast<double>(newest), at::kDouble);  // the minimum, as a max of negatives
  all_reduce_values(groups, groups.world() ? *groups.world() : *groups.pipeline(), step, /*max=*/true,
                    "agreeing on the step to resume from");
  if (!groups.world() && groups.replicas()) {
    all_reduce_values(groups, *groups.replicas(), step, true, "agreeing on the step to resume from");
  }
  const auto start = static_cast<int64_t>(-step.item<double>());
  if (start == 0) return 0;
  // A job of as many ranks loads its own file; one of another size, every
  // rank's, merged and resharded to this job's stages and replicas.
  const int saved_world = steps.at(start).first;
  int64_t saved = 0;
  if (saved_world == world_) {
    saved = load_checkpoint(file(start, rank_, world_), pipe);
  } else {
    std::vector<std::string> files;
    for (int r = 0; r < saved_world; ++r) files.push_back(file(start, r, saved_world));
    saved = load_checkpoint_files(files, pipe);
  }
  if (pipe.is_logging_rank()) {
    std::cout << "resumed from step " << saved << " (" << dir_ << ", written by " << saved_world << " ranks)\n";
  }
  return saved;
}

void RunCheckpoints::after_step(const Pipeline& pipe, int64_t steps) {
  if (every_ <= 0 || steps % every_ != 0) return;
  fs::create_directories(dir_);
  save_checkpoint(file(steps, rank_, world_), pipe, {steps, {}});
  std::error_code ignored;
  fs::remove(file(steps - 2 * every_, rank_, world_), ignored);
}

}  // namespace conveyor::examples
