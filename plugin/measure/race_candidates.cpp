#include "plugin/measure/race_candidates.h"

#include "plugin/core/errors.h"
#include "plugin/model/model_snapshot.h"
#include "plugin/runner/stage_runner.h"
#include "plugin/support/timing.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <iomanip>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

// One round of a finalist: build, warm up for `warmup` steps, time `steps` steps.
void run_round(const torch::nn::Sequential& model, const PipelineOptions& options, const Tensors& inputs,
               const Tensors& targets, const TensorsLossFn& loss_fn, int warmup, int steps, RaceEntry& finalist) {
  StageRunner pipe(model, finalist.candidate.options(options));
  const auto clear = [&] {
    for (const auto& p : pipe.parameters()) p.mutable_grad() = at::Tensor();
  };
  for (int s = 0; s < warmup; ++s) {
    pipe.train_step(inputs, targets, loss_fn);
    clear();
  }
  for (int s = 0; s < steps; ++s) {
    finalist.step_seconds.push_back(pipe.train_step(inputs, targets, loss_fn).wall_seconds);
    clear();
  }
}

}  // namespace

std::vector<size_t> pick_finalists(const SearchResult& search, const RaceOptions& tune) {
  if (search.ranked.empty()) return {};
  const double limit = search.best().prediction.step_seconds() * tune.within();
  size_t eligible = 0;
  while (eligible < search.ranked.size() && search.ranked[eligible].prediction.step_seconds() <= limit) ++eligible;
  eligible = std::max<size_t>(eligible, 1);
  const size_t wanted = std::min(eligible, static_cast<size_t>(tune.finalists()));
  // What a plan is, by what the profile misprices most: the number of
  // workers (beyond the cores), of micro-batches (their size), the schedule;
  // then the two sizes together.
  const auto key = [&](size_t i, int which) {
    const Candidate& c = search.ranked[i];
    const int m = c.prediction.schedule.num_microbatches;
    switch (which) {
      case 0: return std::to_string(c.workers);
      case 1: return std::to_string(m);
      case 2: return c.prediction.schedule.name;
      default: return std::to_string(c.workers) + " x " + std::to_string(m);
    }
  };
  constexpr int kKeys = 4;
  // Per key, each value's best predicted plan: the first in the ranking.
  std::vector<std::map<std::string, size_t>> best_of(kKeys);
  for (size_t i = 0; i < eligible; ++i) {
    for (int k = 0; k < kKeys; ++k) best_of[k].emplace(key(i, k), i);
  }
  std::vector<bool> picked(eligible, false);
  size_t count = 0;
  // The best predicted of the plans that are the best of their `which` and not picked yet.
  const auto next_best = [&](int which) {
    size_t first = eligible;
    for (const auto& [value, i] : best_of[which]) {
      if (!picked[i]) first = std::min(first, i);
    }
    return first;
  };
  const auto pick = [&](size_t i) { picked[i] = true, ++count; };
  for (size_t i = 0; i < eligible && count < wanted && i < static_cast<size_t>(tune.leaders()); ++i) pick(i);
  // Taking turns: workers, micro-batches, schedule; then pairs of the two numbers.
  for (bool progress = true; count < wanted && progress;) {
    progress = false;
    for (int which = 0; which < kKeys - 1 && count < wanted; ++which) {
      if (const size_t i = next_best(which); i < eligible) pick(i), progress = true;
    }
  }
  for (size_t i = next_best(kKeys - 1); count < wanted && i < eligible; i = next_best(kKeys - 1)) pick(i);
  for (size_t i = 0; i < eligible && count < wanted; ++i) {
    if (!picked[i]) pick(i);
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < eligible; ++i) {
    if (picked[i]) out.push_back(i);
  }
  return out;
}

double RaceEntry::measured_seconds() const { return error.empty() ? median(step_seconds) : 0.0; }

std::string Race::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "raced " << finalists.size() << " plans over " << rounds
     << (rounds == 1 ? " round" : " rounds") << " (the slower half dropped after each); chose the fastest measured:\n";
  for (size_t i = 0; i < finalists.size(); ++i) {
    const RaceEntry& f = finalists[i];
    os << (i == best_index ? "  * " : "    ") << f.candidate.describe() << ": predicted " << f.predicted_seconds * 1e3
       << " ms";
    if (f.error.empty()) {
      os << ", measured " << f.measured_seconds() * 1e3 << " ms (median of " << f.step_seconds.size() << ", "
         << f.rounds << (f.rounds == 1 ? " round" : " rounds") << ")\n";
    } else {
      os << ", failed: " << f.error << "\n";
    }
  }
  return os.str();
}

Race race_candidates(const torch::nn::Sequential& model, const SearchResult& search, const PipelineOptions& options,
                     const Tensors& inputs, const Tensors& targets, const TensorsLossFn& loss_fn,
                     const RaceOptions& tune) {
  check_argument(!search.ranked.empty(), "conveyor: race_candidates: the search found no plan to measure");
  check_argument(tune.finalists() >= 1 && tune.steps() >= 1 && tune.rounds() >= 0 && tune.leaders() >= 0 &&
                     tune.warmup() >= 0 && tune.within() >= 1,
                 "conveyor: race_candidates: finalists and steps must be positive, leaders, rounds and warmup "
                 "non-negative and within at least 1, got ",
                 tune.finalists(), ", ", tune.steps(), ", ", tune.leaders(), ", ", tune.rounds(), ", ", tune.warmup(),
                 " and ", tune.within());
  check_argument(static_cast<bool>(loss_fn), "conveyor: race_candidates: no loss function given");
  Race tuning;
  for (size_t i : pick_finalists(search, tune)) {
    const Candidate& c = search.ranked[i];
    tuning.finalists.push_back(RaceEntry{c, c.prediction.step_seconds(), {}, "", 0});
  }
  // Training the finalists moves and steps the weights, buffers and random streams.
  const RestoredOnExit kept(model, /*weights=*/true);
  std::vector<size_t> alive(tuning.finalists.size());
  std::iota(alive.begin(), alive.end(), size_t{0});
  const auto faster = [&](size_t a, size_t b) {
    return tuning.finalists[a].measured_seconds() < tuning.finalists[b].measured_seconds();
  };
  bool more = true;  // another round to race
  do {
    const bool backwards = tuning.rounds % 2 == 1;
    for (size_t k = 0; k < alive.size(); ++k) {
      RaceEntry& f = tuning.finalists[alive[backwards ? alive.size() - 1 - k : k]];
      try {
        run_round(model, options, inputs, targets, loss_fn, tune.warmup(), tune.steps() * (tuning.rounds + 1), f);
      } catch (const std::exception& e) {
        f.error = e.what();
        f.step_seconds.clear();
      }
      ++f.rounds;
      kept.snapshot().restore();
    }
    ++tuning.rounds;
    alive.erase(std::remove_if(alive.begin(), alive.end(),
                               [&](size_t i) { return !tuning.finalists[i].error.empty(); }),
                alive.end());
    std::stable_sort(alive.begin(), alive.end(), faster);
    more = alive.size() > 1 && (tune.rounds() == 0 || tuning.rounds < tune.rounds());
    if (more) alive.resize((alive.size() + 1) / 2);
  } while (more && alive.size() > 1);
  if (alive.empty()) {
    throw std::runtime_error("conveyor: race_candidates: every finalist failed; the first, " +
                             tuning.finalists.front().candidate.describe() + ": " + tuning.finalists.front().error);
  }
  tuning.best_index = alive.front();
  return tuning;
}

}  // namespace conveyor
