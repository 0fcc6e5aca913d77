#pragma once
// The plan for a whole run: of every number of workers (up to the devices or
// processes available), schedule, interleaved chunk count, number of
// micro-batches, eager-1f1b's lookahead, recomputation and offloading, each split by time (Balance::kTime) and
// priced by the planner (plugin/planner/planner.h), the fastest predicted step
// whose every worker fits a memory budget, with the runners-up.
//
//   auto profile = std::make_shared<conveyor::ModelProfile>(conveyor::profile_model(model, x_mb, y_mb, loss));
//   conveyor::SearchSpace space;
//   space.max_workers = 4;
//   space.memory_budget = 2LL << 30;  // per worker's device
//   const conveyor::SearchResult search =
//       conveyor::search_plans(model, conveyor::PipelineOptions().profile(profile), batch_size, space);
//   std::cout << search.str();  // the best plan, then a table of the runners-up
//   conveyor::Pipeline pipe(model, search.best().options(conveyor::PipelineOptions().profile(profile)));
//
// Memory: a worker's predicted peak is the sum of its stages' (an upper
// bound: under an interleaved schedule their peaks need not coincide).
// Asynchronous schedules change what is trained (stale weights), so the
// search takes them only when SearchSpace::schedules names them.

#include "plugin/core/options.h"
#include "plugin/planner/planner.h"
#include "schedules/generators.h"

#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

struct SearchSpace {
  // Workers available (devices, or processes): plans use 1 to this many. 0:
  // as many as PipelineOptions::devices names when it names several, else 1.
  int max_workers = 0;
  std::vector<std::string> schedules = schedules::schedule_names(/*synchronous=*/true);
  // Chunks per worker (v) the interleaved schedules are tried with.
  std::vector<int> chunks = {2, 4};
  // Forwards ahead (PipelineOptions::lookahead) eager-1f1b is tried with: it
  // wins where the link's latency bounds 1F1B (a c10d link in the profile).
  std::vector<int> lookaheads = {1, 2, 4};
  // Micro-batch counts; empty: 1, 2, 4, ... up to the batch size or 64.
  std::vector<int> microbatches = {};
  // With and without activation recomputation (synchronous schedules).
  std::vector<bool> recompute = {false, true};
  // With and without offloading the stash to host memory (synchronous
  // schedules; PipelineOptions::offload): tried only where it moves
  // anything, on an accelerator whose copy to host memory the profile
  // measured (ModelProfile::host_link). On a CPU it is recomputation.
  std::vector<bool> offload = {false, true};
  // Bytes a worker's device may hold for its stages; 0: no limit.
  int64_t memory_budget = 0;
  // Also a schedule synthesised (schedules/synthesise.h) for each worker count
  // (from 2), micro-batch count and 1 or 2 chunks (a V), from the split and
  // predicted costs of the zb-h1 / zb-v plan, under the budget: it runs as
  // schedule_text, named "synthesised".
  bool synthesise = true;
};

struct Candidate {
  Prediction prediction;  // split, schedule and predicted step
  int workers = 1;
  int chunks = 1;     // stages per worker
  int lookahead = 0;  // eager-1f1b's forwards ahead; 0 for the other schedules
  bool recompute = false;
  bool offload = false;  // recomputation from inputs kept in host memory

  int64_t peak_bytes() const;  // the largest worker's (plan.worker_bytes)
  // "1f1b, 2 workers, 8 micro-batches, recompute"; "..., offload"; "eager-1f1b +2, ..."
  std::string describe() const;
  // `base` with this plan's choices: workers, chunks, schedule (and its
  // lookahead), micro-batches,
  // recomputation or offloading and the split (as boundaries). The pipeline built from it
  // runs the plan that was priced.
  PipelineOptions options(PipelineOptions base) const;
};

struct SearchResult {
  std::vector<Candidate> ranked;  // every plan that fits, fastest first
  int considered = 0;              // candidates priced
  int over_budget = 0;             // of them, those that did not fit
  const Candidate& best() const { return ranked.front(); }
  // The best plan in full, then a table of the first `rows` plans.
  std::string str(size_t rows = 8) const;
};

// Searches `space` for `model` with a batch of `batch_size` samples;
// `options` supplies the profile (required), devices, optimizer state and
// everything the search does not choose. Throws std::invalid_argument without
// a profile, and, when no candidate fits, naming the closest one, its worker
// and the bytes it lacks.
SearchResult search_plans(const torch::nn::Sequential& model, const PipelineOptions& options, int64_t batch_size,
                        const SearchSpace& space = {});

}  // namespace conveyor
