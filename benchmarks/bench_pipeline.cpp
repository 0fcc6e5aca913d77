// Where the time goes in a pipelined step: for each schedule, stage count and
// micro-batch count, the measured step time and bubble on this machine, the
// simulator's makespan and bubble fed with the per-stage action times this
// very run measured, and the simulator's projection for one device per stage:
// the same work's compute on one device (every stage's measured actions
// summed) over the simulated makespan, with no transfer cost. On a machine with fewer cores than stages, the measured
// column shows contention; the projection shows the schedule.
//
//   bench_pipeline [--model lstm|mlp] [--batch 32] [--steps 5] [--threads 1] [--stage-rng]
//
// With --predict it measures the planner instead: for K = 2..4 and the
// schedules it prices, the step time and per-stage peak stashed bytes the
// planner predicts from one profile (plugin/planner/planner.h) against the
// median of --steps measured steps (predict_table.h).
//
//   bench_pipeline --predict [--model lstm|mlp|resnet|transformer|bert|translator] [--steps 5]
//
// With --plain it measures the runtime's fixed cost instead: a K = 1, M = 1
// pipeline with its own SGD (divergence guard on, and off) against a plain
// LibTorch loop (zero_grad, forward, loss, backward, step) on the same model,
// at batch 16 and 256, the three taking turns (median of --steps steps).
//
//   bench_pipeline --plain [--model mlp|lstm] [--steps 30]
//
// With --growth, how the LSTM model's step grows with K and M (growth_table.h).
//
//   bench_pipeline --growth --batch 64 [--steps 3]
//
// With --choose, how well the planner chooses a plan (choice_table.h).
//
//   bench_pipeline --choose [--steps 3] [--model one of them] [--profile-shared]

#include "alternated_timing.h"
#include "bench_models.h"
#include "choice_table.h"
#include "growth_table.h"
#include "predict_table.h"
#include "plugin/conveyor.h"
#include "plugin/support/timing.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

using conveyor::bench::make_model;
using conveyor::median;

struct Args {
  std::string model = "lstm";
  int64_t batch = 32;
  int steps = 5;
  int threads = 1;
  bool stage_rng = false;
  bool predict = false;
  bool plain = false;
  bool growth = false;
  bool choose = false;
  bool model_given = false;
  int sharing = 1;  // --predict: stages sharing the CPU while profiling
};

// Mean forward and backward time per stage over the trace's actions.
conveyor::schedules::StageCosts measured_costs(const conveyor::StepResult& r) {
  conveyor::schedules::StageCosts costs;
  for (const auto& stage : r.trace) {
    double f = 0, b = 0;
    int nf = 0, nb = 0;
    for (const auto& e : stage) {
      const double d = (e.end_us - e.start_us) * 1e-6;
      if (e.action.kind == conveyor::schedules::ActionKind::kForward) {
        f += d;
        ++nf;
      } else {
        b += d;
        ++nb;
      }
    }
    costs.forward.push_back(nf ? f / nf : 0);
    costs.backward.push_back(nb ? b / nb : 0);
  }
  return costs;
}

// K = 1, M = 1 against the plain loop it should cost no more than.
int plain_table(const Args& args) {
  std::printf("model %s, %d intra-op thread(s), median of %d alternated steps; ratio = pipeline / plain\n\n",
              args.model.c_str(), args.threads, args.steps);
  std::printf("| batch | plain ms | pipeline ms (guard on) | ratio | pipeline ms (guard off) | ratio |\n"
              "|---|---|---|---|---|---|\n");
  for (int64_t batch : {16, 256}) {
    torch::manual_seed(0);
    const auto [x, y, loss] = conveyor::bench::make_data(args.model, batch);
    auto plain_model = make_model(args.model);
    torch::optim::SGD plain_sgd(plain_model->parameters(), 1e-4);
    const auto sgd = [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 1e-4); };
    conveyor::Pipeline guarded(make_model(args.model),
                               conveyor::PipelineOptions().workers(1).microbatches(1).optimizer(sgd));
    conveyor::Pipeline unguarded(
        make_model(args.model),
        conveyor::PipelineOptions().workers(1).microbatches(1).optimizer(sgd).divergence_guard(false));
    const auto ms = conveyor::bench::alternated_median_ms(
        false, 2, args.steps,
        {[&] {
           plain_sgd.zero_grad();
           loss(plain_model->forward(x), y).backward();
           plain_sgd.step();
         },
         [&] { guarded.train_step(x, y, loss); }, [&] { unguarded.train_step(x, y, loss); }});
    std::printf("| %lld | %.2f | %.2f | %.3f | %.2f | %.3f |\n", static_cast<long long>(batch), ms[0], ms[1],
                ms[1] / ms[0], ms[2], ms[2] / ms[0]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << "bench_pipeline: measured vs simulated pipeline steps for each schedule.\n"
                   "  --model lstm|mlp|resnet|transformer   the LSTM language model of the demo (default),\n"
                   "                     an 8-layer MLP, ResNet-20 or a 4-layer transformer encoder\n"
                   "  --batch N          samples per step (default 32)\n"
                   "  --steps N          measured steps per configuration, after one warm-up (default 5)\n"
                   "  --threads N        intra-op threads (default 1: one core per stage)\n"
                   "  --stage-rng        each stage its own random streams (its forwards take turns)\n"
                   "  --predict          the planner's predicted step time and stash against measured ones\n"
                   "                     (K = 2..4; also --model bert or translator: the examples' models)\n"
                   "  --plain            K = 1, M = 1 against a plain LibTorch loop at batch 16 and 256\n"
                   "  --growth           the LSTM model under 1F1B, K = 1..4, M = 1..64 (up to --batch): predicted\n"
                   "                     beside measured, and the simulator's projection to 8, 16, 64 stages\n"
                   "  --choose           the planner's choice against every plan that fits, measured, on 4 models\n"
                   "                     x 3 memory budgets x up to 2 and 4 workers\n"
                   "  --profile-shared   with --predict, --choose: profile each layer beside a thread running it too,\n"
                   "                     as if the other stage were always busy (ProfileOptions::sharing_stages)\n";
      return 0;
    } else if (a == "--model") {
      args.model = value();
      args.model_given = true;
    } else if (a == "--batch") {
      args.batch = std::stoll(value());
    } else if (a == "--steps") {
      args.steps = std::stoi(value());
    } else if (a == "--predict") {
      args.predict = true;
    } else if (a == "--plain") {
      args.plain = true;
    } else if (a == "--growth") {
      args.growth = true;
    } else if (a == "--choose") {
      args.choose = true;
    } else if (a == "--profile-shared") {
      args.sharing = 2;
    } else if (a == "--stage-rng") {
      args.stage_rng = true;
    } else if (a == "--threads") {
      args.threads = std::stoi(value());
    } else {
      std::cerr << "unknown flag " << a << " (see --help)\n";
      return 2;
    }
  }
  torch::set_num_threads(args.threads);
  torch::manual_seed(0);
  if (args.growth) return conveyor::bench::growth_table(args.steps, args.batch);
  if (args.choose) return conveyor::bench::choice_table(args.steps, args.model_given ? args.model : "", args.sharing);
  if (args.predict) {
    if (conveyor::bench::predict_table_knows(args.model)) {
      return conveyor::bench::predict_table(args.model, args.batch, args.steps, args.threads, args.sharing);
    }
    std::cerr << "--predict --model expects lstm, mlp, resnet, transformer, bert or translator, got '" << args.model
              << "'\n";
    return 2;
  }
  if (args.model != "lstm" && args.model != "resnet" && args.model != "mlp" && args.model != "transformer") {
    std::cerr << "--model expects lstm, mlp, resnet or transformer, got '" << args.model << "'\n";
    return 2;
  }
  const auto [x, y, loss] = conveyor::bench::make_data(args.model, args.batch);
  if (args.plain) return plain_table(args);

  std::printf("model %s, batch %lld, %u hardware threads, %d intra-op thread(s)%s; times in ms per step\n",
              args.model.c_str(), static_cast<long long>(args.batch), std::thread::hardware_concurrency(), args.threads,
              args.stage_rng ? ", stage_rng" : "");
  std::printf("%-10s %2s %2s | %9s %8s | %9s %8s | %13s\n", "schedule", "K", "M", "measured", "bubble", "simulated",
              "bubble", "K-device x");
  for (int k : {1, 2, 4}) {
    for (const char* schedule : {"sequential", "gpipe", "1f1b"}) {
      for (int m : {1, 4, 8}) {
        if (k == 1 && std::string(schedule) != "gpipe") continue;
        auto model = make_model(args.model);
        conveyor::Pipeline pipe(
            model, conveyor::PipelineOptions().workers(k).microbatches(m).schedule(schedule).stage_rng(args.stage_rng));
        pipe.train_step(x, y, loss);  // warm-up
        double wall = 0, bubble = 0;
        conveyor::StepResult last;
        for (int s = 0; s < args.steps; ++s) {
          last = pipe.train_step(x, y, loss);
          wall += last.wall_seconds;
          bubble += last.bubble_fraction;
        }
        wall /= args.steps;
        bubble /= args.steps;
        const auto costs = measured_costs(last);
        const auto sim = conveyor::schedules::simulate(pipe.schedule(), costs);
        double one_device = 0;
        for (double busy : sim.busy) one_device += busy;
        std::printf("%-10s %2d %2d | %9.1f %7.1f%% | %9.1f %7.1f%% | %12.2fx\n", schedule, k, m, wall * 1e3,
                    bubble * 100, sim.makespan * 1e3, sim.bubble_fraction * 100, one_device / sim.makespan);
      }
    }
  }
  std::printf(
      "K-device x: simulated speed-up of one device per stage over the same compute on one device\n"
      "(measured per-stage action times; no transfer cost).\n");
  return 0;
}
