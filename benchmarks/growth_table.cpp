#include "growth_table.h"

#include "bench_models.h"
#include "plugin/conveyor.h"
#include "plugin/support/timing.h"
#include "schedules/generators.h"
#include "schedules/simulate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace conveyor::bench {

namespace {

constexpr int64_t kWords = 35;

struct Row {
  int k = 1, m = 1;
  std::unique_ptr<Pipeline> pipe;
  Prediction plan;
  std::vector<double> wall;
  std::vector<int64_t> stash;
  double forward = 0, backward = 0;  // K = 1: mean per micro-batch, from the last step's trace
};

std::string per_stage(const std::vector<int64_t>& bytes) {
  std::string out;
  for (size_t k = 0; k < bytes.size(); ++k) out += (k ? " / " : "") + std::to_string(bytes[k] / 1024);
  return out;
}

}  // namespace

int growth_table(int steps, int64_t batch) {
  const auto [x, y, loss] = make_data("lstm", batch);  // kWords words each
  torch::manual_seed(0);
  const auto profile = std::make_shared<ModelProfile>(
      profile_first_microbatch(make_model("lstm"), x, y, loss, PipelineOptions().microbatches(8)));
  std::vector<Row> rows;
  for (int k = 1; k <= 4; ++k) {
    for (int m = 1; m <= 64 && m <= batch; m *= 2) {
      torch::manual_seed(0);
      auto model = make_model("lstm");
      const auto options =
          PipelineOptions().workers(k).microbatches(m).schedule("1f1b").profile(profile).balance(Balance::kTime);
      Row r;
      r.k = k;
      r.m = m;
      r.plan = predict_step(model, options, batch);
      r.pipe = std::make_unique<Pipeline>(model, options);
      r.pipe->train_step(x, y, loss);  // warm-up
      rows.push_back(std::move(r));
    }
  }
  for (int s = 0; s < steps; ++s) {
    for (auto& r : rows) {
      for (const auto& p : r.pipe->parameters()) p.mutable_grad() = at::Tensor();
      const StepResult step = r.pipe->train_step(x, y, loss);
      r.wall.push_back(step.wall_seconds);
      r.stash = step.peak_stash_bytes;
      if (r.k != 1) continue;
      double f = 0, b = 0;
      for (const auto& e : step.trace[0]) {
        (e.action.kind == schedules::ActionKind::kForward ? f : b) += (e.end_us - e.start_us) * 1e-6;
      }
      r.forward = f / r.m;
      r.backward = b / r.m;
    }
  }
  std::printf("LSTM language model, batch %lld x %lld words, 1f1b, split by time, median of %d steps taking turns\n\n",
              static_cast<long long>(batch), static_cast<long long>(kWords), steps);
  std::printf("| K | M | predicted ms | measured ms | error | predicted peak MiB (fullest stage) | predicted stash KiB "
              "(per stage) | measured | error |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    const double measured = median(r.wall), predicted = r.plan.step_seconds();
    std::vector<int64_t> want;
    int64_t peak = 0;
    double worst = 0;
    for (size_t k = 0; k < r.plan.predicted.size(); ++k) {
      want.push_back(r.plan.predicted[k].stash_bytes);
      peak = std::max(peak, r.plan.predicted[k].peak_bytes());
      if (r.stash[k] > 0) worst = std::max(worst, std::abs(double(want[k] - r.stash[k])) / double(r.stash[k]));
    }
    std::printf("| %d | %d | %.1f | %.1f | %+.1f%% | %.1f | %s | %s | %.1f%% |\n", r.k, r.m, predicted * 1e3,
                measured * 1e3, 100 * (predicted / measured - 1), double(peak) / (1 << 20), per_stage(want).c_str(),
                per_stage(r.stash).c_str(), 100 * worst);
  }
  // Projection: the model's measured cost at K = 1 cut into K equal stages,
  // one device each, 1F1B; a boundary moves one micro-batch's LSTM output.
  std::printf("\nProjection (simulator, not measured): the K = 1 measured forward and backward per micro-batch cut "
              "into K equal stages, one device per stage, the profiled link per boundary\n\n");
  std::printf("| K | M | projected step ms | bubble | speed-up over K = 1 (measured) | micro-batches stashed on "
              "stage 0 | stash KiB on stage 0 |\n|---|---|---|---|---|---|---|\n");
  for (int k : {8, 16, 64}) {
    for (const auto& r : rows) {
      if (r.k != 1 || r.m < 8) continue;
      const int64_t samples = (batch + r.m - 1) / r.m, boundary = samples * kWords * 256 * 4;
      auto costs = schedules::StageCosts::uniform(k, r.forward / k, r.backward / k, profile->link.seconds(boundary));
      const auto sim = schedules::simulate(schedules::make_1f1b(k, r.m), costs);
      std::printf("| %d | %d | %.1f | %.1f%% | %.2fx | %d | %lld |\n", k, r.m, sim.makespan * 1e3,
                  100 * sim.bubble_fraction, median(r.wall) / sim.makespan, sim.peak_inflight[0],
                  static_cast<long long>(sim.peak_inflight[0] * boundary / 1024));
    }
  }
  return 0;
}

}  // namespace conveyor::bench
