#include "choice_table.h"

#include "bench_models.h"
#include "plugin/conveyor.h"
#include "plugin/support/timing.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace conveyor::bench {

namespace {

// A plan as the grid measures it: its choices and its split.
std::string plan_key(const Candidate& c) {
  std::string key = c.describe() + ", split at";
  for (size_t s = 1; s < c.prediction.split.stages.size(); ++s) {
    key += ' ';
    key += std::to_string(c.prediction.split.stages[s].begin);
  }
  return key;
}

struct Measured {
  Candidate choice;
  std::unique_ptr<Pipeline> pipe;
  std::vector<double> wall;     // screening: every plan in turn
  std::vector<double> decided;  // the plans that decide a cell, alone in turn
  double predicted = 0, predicted_shared = 0;  // ms: each worker a device of its own; sharing the CPU
  double screened_ms() const { return median(wall) * 1e3; }
  double ms() const { return median(decided.empty() ? wall : decided) * 1e3; }
};

struct Cell {
  int devices = 2;
  int64_t budget = 0;
  std::vector<std::string> fits;  // keys of the plans that fit
  std::string chosen, chosen_cores, tuned;  // tuned: the counted search's finalists measured (race_candidates)
};

SearchSpace grid_space(int devices, int64_t budget) {
  SearchSpace space;  // every synchronous built-in schedule
  space.max_workers = devices;
  space.memory_budget = budget;
  space.chunks = {2};
  space.lookaheads = {1, 2};
  space.microbatches = {1, 2, 4, 8, 16};
  return space;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Tally {
  int cells = 0, within = 0, within_cores = 0, within_tuned = 0;
  int plans = 0, predicted_within = 0, shared_within = 0;
};

void run_model(const std::string& kind, int64_t batch, int steps, int sharing, Tally& tally) {
  torch::manual_seed(0);
  const auto [x, y, loss] = make_data(kind, batch);
  ModelProfile measured_profile =
      profile_first_microbatch(make_model(kind), x, y, loss, PipelineOptions().microbatches(4),
                               ProfileOptions().count_cores(true).sharing_stages(sharing));
  std::fprintf(stderr, "%s", measured_profile.str().c_str());
  const auto with_cores = std::make_shared<ModelProfile>(measured_profile);
  measured_profile.cores = 0;
  const auto profile = std::make_shared<ModelProfile>(measured_profile);
  const torch::nn::Sequential reference = make_model(kind);
  const PipelineOptions base = PipelineOptions().profile(profile);

  // The budgets, from the unconstrained search on up to 2 workers.
  const SearchResult open = search_plans(reference, base, batch, grid_space(2, 0));
  int64_t one_worker = 0, leanest = open.best().peak_bytes();
  for (const Candidate& c : open.ranked) {
    leanest = std::min(leanest, c.peak_bytes());
    if (c.workers == 1 && c.prediction.schedule.num_microbatches == 1 && !c.recompute) one_worker = c.peak_bytes();
  }
  // Just above the leanest: a budget splits within it, which need not find
  // the unconstrained split (an interleaved worker's stages each get half).
  int64_t tight = leanest + leanest / 10;
  while (true) {
    try {
      search_plans(reference, base, batch, grid_space(2, tight));
      break;
    } catch (const std::invalid_argument&) {
      tight += leanest / 10;
    }
  }
  const std::vector<int64_t> budgets = {0, (one_worker + tight) / 2, tight};
  std::fprintf(stderr, "%s: %zu plans without a budget on 2 workers; budgets %.2f and %.2f MiB\n", kind.c_str(),
               open.ranked.size(), mib(budgets[1]), mib(budgets[2]));

  std::map<std::string, Measured> plans;
  std::map<std::string, Candidate> tunings;  // by the finalists' keys
  std::vector<Cell> cells;
  for (int64_t budget : budgets) {
    for (int devices : {2, 4}) {
      Cell cell{devices, budget, {}, {}, {}, {}};
      const SearchResult search = search_plans(reference, base, batch, grid_space(devices, budget));
      for (const Candidate& c : search.ranked) {
        const std::string key = plan_key(c);
        cell.fits.push_back(key);
        if (!plans.count(key)) plans[key].choice = c;
      }
      cell.chosen = plan_key(search.best());
      const SearchResult counted =
          search_plans(reference, PipelineOptions().profile(with_cores), batch, grid_space(devices, budget));
      cell.chosen_cores = plan_key(counted.best());
      if (!plans.count(cell.chosen_cores)) plans[cell.chosen_cores].choice = counted.best();
      // The planner's tuned choice: plans of its search raced on the batch
      // (cells with the same finalists share one tuning).
      std::string finalists;
      for (size_t i : pick_finalists(counted)) finalists += plan_key(counted.ranked[i]) + "; ";
      if (!tunings.count(finalists)) {
        const TensorsLossFn tensors_loss = [loss](const Tensors& out, const Tensors& t) { return loss(out[0], t[0]); };
        const Race tuning =
            race_candidates(reference, counted, PipelineOptions().profile(with_cores), {x}, {y}, tensors_loss);
        std::fprintf(stderr, "%s", tuning.str().c_str());
        tunings[finalists] = tuning.best();
      }
      cell.tuned = plan_key(tunings.at(finalists));
      if (!plans.count(cell.tuned)) plans[cell.tuned].choice = tunings.at(finalists);
      cells.push_back(std::move(cell));
    }
  }
  std::fprintf(stderr, "%s: building %zu pipelines\n", kind.c_str(), plans.size());
  for (auto& [key, m] : plans) {
    m.predicted = predict_step(reference, m.choice.options(base), batch).step_seconds() * 1e3;
    m.predicted_shared =
        predict_step(reference, m.choice.options(PipelineOptions().profile(with_cores)), batch).step_seconds() * 1e3;
    torch::manual_seed(0);
    m.pipe = std::make_unique<Pipeline>(make_model(kind), m.choice.options(base));
    m.pipe->train_step(x, y, loss);  // warm-up
    for (const auto& p : m.pipe->parameters()) p.mutable_grad() = at::Tensor();
  }
  for (int s = 0; s < steps; ++s) {
    for (auto& [key, m] : plans) {
      m.wall.push_back(m.pipe->train_step(x, y, loss).wall_seconds);
      for (const auto& p : m.pipe->parameters()) p.mutable_grad() = at::Tensor();  // hundreds of pipelines live
    }
  }

  // The screening picks, and the fastest of hundreds of noisy medians is
  // biased low (the winner's curse): the plans that decide a cell (its
  // choices and its three fastest screened) are measured again, the others'
  // pipelines released (as a run has one pipeline alive, not hundreds),
  // taking turns for nine times as many steps; a cell's best is the fastest
  // of its deciding plans in that measurement.
  std::set<std::string> deciding;
  for (Cell& cell : cells) {
    std::sort(cell.fits.begin(), cell.fits.end(), [&](const auto& a, const auto& b) {
      return plans.at(a).screened_ms() < plans.at(b).screened_ms();
    });
    for (size_t i = 0; i < cell.fits.size() && i < 3; ++i) deciding.insert(cell.fits[i]);
    deciding.insert(cell.chosen);
    deciding.insert(cell.chosen_cores);
    deciding.insert(cell.tuned);
  }
  for (auto& [key, m] : plans) {
    if (!deciding.count(key)) m.pipe.reset();
  }
  for (int s = 0; s < 9 * steps; ++s) {
    for (const std::string& key : deciding) {
      Measured& m = plans.at(key);
      m.decided.push_back(m.pipe->train_step(x, y, loss).wall_seconds);
      for (const auto& p : m.pipe->parameters()) p.mutable_grad() = at::Tensor();
    }
  }
  std::fprintf(stderr, "%s: %zu deciding plans measured again\n", kind.c_str(), deciding.size());

  int predicted_within = 0, shared_within = 0;
  std::vector<double> errors, shared_errors;
  for (const auto& [key, m] : plans) {
    errors.push_back(std::abs(m.predicted / m.ms() - 1));
    shared_errors.push_back(std::abs(m.predicted_shared / m.ms() - 1));
    predicted_within += errors.back() <= 0.10;
    shared_within += shared_errors.back() <= 0.10;
  }
  tally.plans += static_cast<int>(plans.size());
  tally.predicted_within += predicted_within;
  tally.shared_within += shared_within;
  std::printf("\n### %s, batch %lld: %zu distinct plans measured\n\nPredicted step within 10 %% of the measured one "
              "for %d of %zu plans (median |error| %.1f %%) taking each worker as a device; %d (median %.1f %%) "
              "with the CPU's sharing counted.\n\n",
              kind.c_str(), static_cast<long long>(batch), plans.size(), predicted_within, plans.size(),
              100 * median(errors), shared_within, 100 * median(shared_errors));
  std::printf("| workers <= | budget MiB | plans that fit | planner's choice | predicted ms | measured ms | x best "
              "| choice, CPU sharing counted | measured ms | x best | tuned choice | measured ms | x best "
              "| best measured | ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Cell& cell : cells) {
    const auto best = std::min_element(cell.fits.begin(), cell.fits.end(), [&](const auto& a, const auto& b) {
      const bool da = deciding.count(a), db = deciding.count(b);
      return da != db ? da : plans.at(a).ms() < plans.at(b).ms();
    });
    const Measured &b = plans.at(*best), &c = plans.at(cell.chosen), &cc = plans.at(cell.chosen_cores);
    const Measured& t = plans.at(cell.tuned);
    const double ratio = c.ms() / b.ms(), ratio_cores = cc.ms() / b.ms(), ratio_tuned = t.ms() / b.ms();
    ++tally.cells;
    tally.within += ratio <= 1.05;
    tally.within_cores += ratio_cores <= 1.05;
    tally.within_tuned += ratio_tuned <= 1.05;
    std::printf("| %d | %s | %zu | %s | %.1f | %.1f | %.3f | %s | %.1f | %.3f | %s | %.1f | %.3f | %s | %.1f |\n",
                cell.devices,
                cell.budget ? std::to_string(static_cast<int>(std::lround(mib(cell.budget)))).c_str() : "none",
                cell.fits.size(), c.choice.describe().c_str(), c.predicted, c.ms(), ratio,
                cell.chosen_cores == cell.chosen ? "same" : cc.choice.describe().c_str(), cc.ms(), ratio_cores,
                cell.tuned == cell.chosen_cores ? "same" : t.choice.describe().c_str(), t.ms(), ratio_tuned,
                b.choice.describe().c_str(), b.ms());
  }
  std::vector<const Measured*> fastest;
  for (const auto& [key, m] : plans) fastest.push_back(&m);
  std::sort(fastest.begin(), fastest.end(), [](const Measured* a, const Measured* b) { return a->ms() < b->ms(); });
  std::printf("\nThe eight fastest measured plans, and the planner's choice without a budget:\n\n"
              "| plan | predicted ms | measured ms | error | predicted, CPU shared | error |\n"
              "|---|---|---|---|---|---|\n");
  fastest.resize(std::min<size_t>(fastest.size(), 8));
  fastest.push_back(&plans.at(cells.front().chosen));
  for (const Measured* m : fastest) {
    std::printf("| %s | %.1f | %.1f | %+.1f%% | %.1f | %+.1f%% |\n", m->choice.describe().c_str(), m->predicted,
                m->ms(),
                100 * (m->predicted / m->ms() - 1), m->predicted_shared, 100 * (m->predicted_shared / m->ms() - 1));
  }
  std::fflush(stdout);
}

}  // namespace

int choice_table(int steps, const std::string& only, int sharing) {
  std::printf("How the planner chooses: per cell, every plan of the space that fits screened (median of %d steps, "
              "a model's plans taking turns), then the plans deciding a cell (the choices, the three fastest "
              "screened) measured again with the others released (median of %d steps, taking turns); "
              "%u hardware threads, %d intra-op thread(s) per worker; each layer profiled beside %d other "
              "thread(s) running it.\n"
              "Space: every synchronous built-in schedule; 1..workers stages; interleaved with 2 chunks; "
              "eager-1f1b lookahead 1, 2; M = 1, 2, 4, 8, 16; with and without recomputation; split by time.\n",
              steps, 9 * steps, std::thread::hardware_concurrency(), torch::get_num_threads(), sharing - 1);
  if (!only.empty() && only != "mlp" && only != "lstm" && only != "resnet" && only != "transformer") {
    std::fprintf(stderr, "--choose --model expects mlp, lstm, resnet or transformer, got '%s'\n", only.c_str());
    return 2;
  }
  Tally tally;
  for (const auto& [kind, batch] : std::vector<std::pair<std::string, int64_t>>{
           {"mlp", 256}, {"lstm", 32}, {"resnet", 32}, {"transformer", 32}}) {
    if (only.empty() || only == kind) run_model(kind, batch, steps, sharing, tally);
  }
  std::printf("\nChoice within 5 %% of the best measured plan: %d of %d cells (profile as measured), %d of %d (CPU "
              "sharing counted), %d of %d (tuned: up to %d plans raced). Predictions within 10 %%: %d of %d "
              "plans (%d with the CPU's sharing counted).\n",
              tally.within, tally.cells, tally.within_cores, tally.cells, tally.within_tuned, tally.cells,
              RaceOptions().finalists(), tally.predicted_within, tally.plans, tally.shared_within);
  return 0;
}

}  // namespace conveyor::bench
