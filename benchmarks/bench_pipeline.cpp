// Where the time goes in a pipelined step: for each schedule, stage count and
// micro-batch count, the measured step time and bubble on this machine, the
// simulator's makespan and bubble fed with the per-stage action times this
// very run measured, and the simulator's projection for one device per stage:
// the same work's compute on one device (every stage's measured actions
// summed) over the simulated makespan, with no transfer cost. On a machine with fewer cores than stages, the measured
// column shows contention; the projection shows the schedule.
//
//   bench_pipeline [--model lstm|mlp] [--batch 32] [--steps 5] [--threads 1] [--stage-rng]

#include "plugin/conveyor.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

namespace {

struct Args {
  std::string model = "lstm";
  int64_t batch = 32;
  int steps = 5;
  int threads = 1;
  bool stage_rng = false;
};

torch::nn::Sequential make_model(const std::string& kind) {
  if (kind == "mlp") {
    torch::nn::Sequential m;
    for (int i = 0; i < 8; ++i) {
      m->push_back(torch::nn::Linear(512, 512));
      m->push_back(torch::nn::Tanh());
    }
    return m;
  }
  return torch::nn::Sequential(
      torch::nn::Embedding(10000, 128),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(128, 256).batch_first(true)),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(256, 256).batch_first(true)),
      conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(256, 256).batch_first(true)),
      torch::nn::Linear(256, 10000));
}

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
                   "  --model lstm|mlp   the LSTM language model of the demo (default) or an 8-layer MLP\n"
                   "  --batch N          samples per step (default 32)\n"
                   "  --steps N          measured steps per configuration, after one warm-up (default 5)\n"
                   "  --threads N        intra-op threads (default 1: one core per stage)\n"
                   "  --stage-rng        each stage its own random streams (its forwards take turns)\n";
      return 0;
    } else if (a == "--model") {
      args.model = value();
    } else if (a == "--batch") {
      args.batch = std::stoll(value());
    } else if (a == "--steps") {
      args.steps = std::stoi(value());
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
  const bool lstm = args.model == "lstm";
  const at::Tensor x = lstm ? torch::randint(10000, {args.batch, 35}) : torch::randn({args.batch, 512});
  const at::Tensor y = lstm ? torch::randint(10000, {args.batch, 35}) : torch::randn({args.batch, 512});
  const conveyor::LossFn loss = [lstm](const at::Tensor& out, const at::Tensor& t) {
    return lstm ? torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), t.reshape({-1}))
                : torch::mse_loss(out, t);
  };

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
            model, conveyor::PipelineOptions().stages(k).microbatches(m).schedule(schedule).stage_rng(args.stage_rng));
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
