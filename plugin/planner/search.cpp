#include "plugin/planner/search.h"

#include "plugin/core/errors.h"
#include "plugin/planner/balance_time.h"
#include "plugin/planner/predict_synthesised.h"
#include "plugin/planner/units.h"
#include "schedules/generators.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

namespace conveyor {

namespace {

// Whether `name` trains with exact gradients of the whole batch (what
// recomputation applies to).
bool synchronous(const std::string& name) {
  try {
    return schedules::make_schedule(name, 1, 1, false, 1).synchronous();
  } catch (const std::exception&) {
    return true;  // the candidate's own build names the problem
  }
}

std::vector<std::pair<int, int>> pairs(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<std::pair<int, int>> out;
  for (int x : a) {
    for (int y : b) out.emplace_back(x, y);
  }
  return out;
}

// Whether a smaller lookahead than `lookahead` already runs every forward
// ahead on stage 0 (its warm-up, min(M, (1 + a)(K - 1)), reaches M).
bool saturated(const std::vector<int>& lookaheads, int lookahead, int workers, int m) {
  return std::any_of(lookaheads.begin(), lookaheads.end(),
                     [&](int a) { return a >= 1 && a < lookahead && (1 + a) * (workers - 1) >= m; });
}

std::vector<int> microbatch_counts(const SearchSpace& space, int64_t batch) {
  if (!space.microbatches.empty()) return space.microbatches;
  std::vector<int> counts;
  for (int m = 1; m <= std::min<int64_t>(batch, 64); m *= 2) counts.push_back(m);
  return counts;
}

// `base` with a plan's choices (its first `workers` devices, when it names
// several); the split is left to the caller.
PipelineOptions with_choices(PipelineOptions base, const std::string& schedule, int workers, int chunks,
                             int lookahead, int microbatches, bool recompute, bool offload) {
  base.workers(workers)
      .chunks(schedules::is_interleaved(schedule) ? chunks : 0)
      .lookahead(lookahead)
      .schedule(schedule)
      .schedule_text("")
      .microbatches(microbatches)
      .recompute(recompute)
      .offload(offload);
  if (base.devices().size() > 1) {
    base.devices(std::vector<std::string>(base.devices().begin(),
                                          base.devices().begin() + std::min<size_t>(workers, base.devices().size())));
  }
  return base;
}

}  // namespace

int64_t Candidate::peak_bytes() const {
  const auto& bytes = prediction.worker_bytes;
  return bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
}

std::string Candidate::describe() const {
  std::ostringstream os;
  os << prediction.schedule.name;
  if (lookahead > 0) os << " +" << lookahead;
  os << ", " << workers << (workers == 1 ? " worker" : " workers");
  if (chunks > 1) os << " x " << chunks << " chunks";
  const int m = prediction.schedule.num_microbatches;
  os << ", " << m << (m == 1 ? " micro-batch" : " micro-batches");
  if (recompute) os << ", recompute";
  if (offload) os << ", offload";
  return os.str();
}

PipelineOptions Candidate::options(PipelineOptions base) const {
  std::vector<int64_t> boundaries;
  for (size_t k = 1; k < prediction.split.stages.size(); ++k) boundaries.push_back(prediction.split.stages[k].begin);
  if (prediction.schedule.name == kSynthesisedSchedule) {  // not a generator's: the schedule itself travels
    return with_choices(std::move(base), "1f1b", workers, 0, 0, prediction.schedule.num_microbatches, false, false)
        .schedule_text(prediction.schedule.str())
        .boundaries(std::move(boundaries));
  }
  return with_choices(std::move(base), prediction.schedule.name, workers, chunks, lookahead, prediction.schedule.num_microbatches,
                      recompute, offload)
      .boundaries(std::move(boundaries));
}

std::string SearchResult::str(size_t rows) const {
  std::ostringstream os;
  os << "searched " << considered << " plans, " << over_budget << " over the memory budget; the fastest:\n";
  if (ranked.empty()) return os.str();
  os << best().describe() << "\n" << best().prediction.str();
  os << "  rank  step        bubble  peak/worker  plan\n";
  for (size_t i = 0; i < ranked.size() && i < rows; ++i) {
    const Candidate& c = ranked[i];
    os << "  " << std::setw(4) << i + 1 << "  " << std::left << std::setw(10) << ms(c.prediction.step_seconds()) << "  "
       << std::setw(6) << percent(c.prediction.bubble_fraction()) << "  " << std::setw(11) << mib(c.peak_bytes()) << "  "
       << std::right << c.describe() << "\n";
  }
  return os.str();
}

SearchResult search_plans(const torch::nn::Sequential& model, const PipelineOptions& options, int64_t batch,
                        const SearchSpace& space) {
  if (!options.profile()) {
    throw std::invalid_argument("conveyor: search_plans needs the model's profile (PipelineOptions::profile)");
  }
  check_argument(batch >= 1, "conveyor: search_plans needs a batch of at least one sample, got ", batch);
  check_argument(space.max_workers >= 0 && space.memory_budget >= 0,
                 "conveyor: PlanSpace needs a non-negative number of workers and memory budget");
  const int64_t num_layers = static_cast<int64_t>(model->size());
  const int max_workers =
      space.max_workers > 0 ? space.max_workers : std::max<int>(1, static_cast<int>(options.devices().size()));
  // What a stage keeps: its graph, its inputs (recompute), or its inputs in
  // host memory (offload, where the profile has a host link to move them over).
  std::vector<std::pair<bool, bool>> stashes;
  for (bool recompute : space.recompute) stashes.emplace_back(recompute, false);
  const bool offloads = !options.profile()->host_link.kind.empty() &&
                        std::find(space.offload.begin(), space.offload.end(), true) != space.offload.end();
  if (offloads) stashes.emplace_back(false, true);
  SearchResult out;
  std::string first_error, closest;
  int64_t closest_excess = std::numeric_limits<int64_t>::max();
  // Ranks a priced plan, or counts it over the budget and keeps the closest miss.
  const auto admit = [&](Candidate choice) {
    const int64_t excess = space.memory_budget > 0 ? choice.peak_bytes() - space.memory_budget : 0;
    if (excess > 0) {
      ++out.over_budget;
      if (excess < closest_excess) {
        const auto& bytes = choice.prediction.worker_bytes;
        const auto worst = std::max_element(bytes.begin(), bytes.end());
        closest_excess = excess;
        closest = c10::str(choice.describe(), ": worker ", worst - bytes.begin(), " needs ",
                           bytes_text(*worst), ", ", bytes_text(excess), " more than the budget");
      }
      return;
    }
    out.ranked.push_back(std::move(choice));
  };
  // The plans whose split and costs a synthesised schedule takes: zb-h1 and
  // zb-v without recomputation, per micro-batch count, priced whether or not
  // they fit the budget (the synthesised one may fit where they do not).
  std::vector<Candidate> synthesis_bases;
  for (int workers = 1; workers <= max_workers; ++workers) {
    for (const std::string& name : space.schedules) {
      const bool exact = synchronous(name);
      const std::vector<int> chunk_counts = schedules::is_interleaved(name) ? space.chunks
                                             : std::vector<int>{schedules::default_chunks(name)};
      // eager-1f1b with each lookahead; on one worker it is 1f1b.
      const bool eager = name == "eager-1f1b";
      const std::vector<int> lookaheads = eager ? space.lookaheads : std::vector<int>{0};
      for (const auto& [chunks, lookahead] : pairs(chunk_counts, lookaheads)) {
        if (chunks < 1 || workers * chunks > num_layers) continue;  // a stage needs a layer
        if (eager && (workers < 2 || lookahead < 1)) continue;
        for (int m : microbatch_counts(space, batch)) {
          if (m < 1 || m > batch) continue;
          if (eager && saturated(lookaheads, lookahead, workers, m)) continue;  // a smaller one's schedule
          for (const auto& [recompute, offload] : stashes) {
            if ((recompute || offload) && !exact) continue;
            ++out.considered;
            Candidate choice;
            choice.workers = workers;
            choice.chunks = chunks;
            choice.lookahead = lookahead;
            choice.recompute = recompute;
            choice.offload = offload;
            choice.prediction.schedule.name = name;  // for describe() until the plan is made
            choice.prediction.schedule.num_microbatches = m;
            const PipelineOptions split_by_time = with_choices(options, name, workers, chunks, lookahead, m,
                                                               recompute, offload)
                                                      .boundaries({})
                                                      .balance(Balance::kTime);
            const bool synthesis_base =
                space.synthesise && (name == "zb-h1" || name == "zb-v") && !recompute && !offload;
            if (synthesis_base && space.memory_budget > 0) {
              try {  // the split by time alone: a synthesised order may fit where this one does not
                Candidate base = choice;
                base.prediction = predict_step(model, PipelineOptions(split_by_time).memory_budgets({}), batch);
                synthesis_bases.push_back(std::move(base));
              } catch (const std::invalid_argument&) {
                // the candidate below names the problem
              }
            }
            try {
              // Split by time within the budget's share of each stage.
              const PipelineOptions candidate = PipelineOptions(split_by_time)
                                                    .memory_budgets(space.memory_budget > 0
                                                                        ? std::vector<int64_t>{space.memory_budget / chunks}
                                                                        : std::vector<int64_t>{});
              choice.prediction = predict_step(model, candidate, batch);
              if (synthesis_base && space.memory_budget == 0) synthesis_bases.push_back(choice);  // the same split
            } catch (const std::invalid_argument& e) {
              const std::string message = e.what();
              if (message.find("budget") != std::string::npos) {
                ++out.over_budget;  // the split by time found no stage fitting its share
                if (closest.empty()) closest = choice.describe() + ": " + message;
              } else if (first_error.empty()) {
                first_error = c10::str(name, " on ", workers, " workers with ", m, " micro-batches: ", message);
              }
              continue;
            }
            admit(std::move(choice));
          }
        }
      }
    }
    // A schedule synthesised for each split the fixed families' search priced
    // with zb-h1 (1 chunk per worker) or zb-v (2 in a V), under the budget.
    if (!space.synthesise || workers < 2) continue;
    for (const Candidate& base : synthesis_bases) {
      Candidate choice = base;
      ++out.considered;
      try {
        choice.prediction = predict_synthesised(model, with_choices(options, base.prediction.schedule.name, workers, 0, 0,
                                                           base.prediction.schedule.num_microbatches, false, false),
                                       base.prediction, batch, space.memory_budget);
      } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).find("memory cap") != std::string::npos ||
            std::string(e.what()).find("budget") != std::string::npos) {
          ++out.over_budget;
        } else if (first_error.empty()) {
          first_error = c10::str(kSynthesisedSchedule, " on ", workers, " workers: ", e.what());
        }
        continue;
      }
      admit(std::move(choice));
    }
    synthesis_bases.clear();
  }
  // Fastest first; among equals (to rounding), fewer workers, then less
  // memory on the fullest worker, then on all of them.
  const auto total = [](const Candidate& c) {
    return std::accumulate(c.prediction.worker_bytes.begin(), c.prediction.worker_bytes.end(), int64_t{0});
  };
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [&](const Candidate& a, const Candidate& b) {
    const double ta = a.prediction.step_seconds(), tb = b.prediction.step_seconds();
    if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
    if (a.workers != b.workers) return a.workers < b.workers;
    if (a.peak_bytes() != b.peak_bytes()) return a.peak_bytes() < b.peak_bytes();
    return total(a) < total(b);
  });
  if (out.ranked.empty()) {
    if (!closest.empty()) {
      throw std::invalid_argument(c10::str("conveyor: no plan fits a memory budget of ",
                                           bytes_text(space.memory_budget), " per worker (", out.considered,
                                           " tried); the closest: ", closest));
    }
    throw std::invalid_argument("conveyor: no plan could be made: " +
                                (first_error.empty() ? std::string("the search space is empty") : first_error));
  }
  return out;
}

}  // namespace conveyor
