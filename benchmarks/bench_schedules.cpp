// The schedules beyond the seeds on this machine: for 1F1B, interleaved 1F1B,
// ZB-H1 and interleaved zero bubble (and GPipe / 1F1B with recomputation),
// the measured step time and bubble, the simulator's makespan and bubble fed
// with the per-stage action times the same run measured (F, B, and for split
// backwards I and W), and the peak stashed bytes per stage the runtime
// reports, and schedules synthesised from the measured action times (ZB-H1's
// F, I, W, 1F1B's B) at half, once and twice 1F1B's memory, and in a V
// (ZB-V's F, I, W, DualPipeV's B) at the V schedules' caps. Configurations take
// turns step by step; medians of --steps steps.
//
//   bench_schedules [--model mlp|lstm] [--workers 2] [--microbatches 8] [--batch 64] [--steps 7]
//                   [--threads 1]
//
// The workers share this machine's cores: the measured column is what this
// machine does; the simulated one is the schedule fed with its own measured
// action times (one device per stage, no transfer cost).

#include "examples/common/flags.h"
#include "plugin/conveyor.h"
#include "plugin/support/timing.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using conveyor::median;

using conveyor::schedules::ActionKind;

struct Args {
  std::string model = "mlp";
  int workers = 2, microbatches = 8, steps = 7, threads = 1;
  int64_t batch = 64;
};

// 16 layers: 8 Linear(512, 512) + Tanh pairs, so every chunk of K = 2..4
// workers of 2 chunks gets whole pairs. The LSTM model: embedding, 6 LSTMs of
// 256, decoder over 2,000 words.
torch::nn::Sequential make_model(const std::string& kind) {
  torch::nn::Sequential m;
  if (kind == "lstm") {
    m->push_back(torch::nn::Embedding(2000, 256));
    for (int i = 0; i < 6; ++i) {
      m->push_back(conveyor::FirstOutput<torch::nn::LSTM>(torch::nn::LSTMOptions(256, 256).batch_first(true)));
    }
    m->push_back(torch::nn::Linear(256, 2000));
    return m;
  }
  for (int i = 0; i < 8; ++i) {
    m->push_back(torch::nn::Linear(512, 512));
    m->push_back(torch::nn::Tanh());
  }
  return m;
}

// Mean action times per stage from a traced step: forward, whole backward,
// and the W share of split ones.
conveyor::schedules::StageCosts measured_costs(const conveyor::StepResult& r) {
  conveyor::schedules::StageCosts costs;
  for (const auto& stage : r.trace) {
    std::map<ActionKind, std::pair<double, int>> sum;
    for (const auto& e : stage) {
      auto& [seconds, count] = sum[e.action.kind];
      seconds += (e.end_us - e.start_us) * 1e-6;
      ++count;
    }
    const auto mean = [&](ActionKind k) { return sum[k].second ? sum[k].first / sum[k].second : 0.0; };
    const double w = mean(ActionKind::kWeight);
    const double b =
        sum[ActionKind::kBackward].second ? mean(ActionKind::kBackward) : mean(ActionKind::kBackwardInput) + w;
    costs.forward.push_back(mean(ActionKind::kForward));
    costs.backward.push_back(b);
    costs.weight.push_back(sum[ActionKind::kWeight].second ? w : b / 2);
  }
  return costs;
}

constexpr const char* kHelp =
    "bench_schedules: measured vs simulated steps of 1f1b, interleaved, zb-h1, zb-interleaved, the V schedules\n"
    "  and schedules synthesised from measured costs: from zb-h1's at half, once and twice 1F1B's memory, and\n"
    "  in a V from zb-v's at the caps of v-min, v-half and zb-v.\n"
    "  --model mlp|lstm   16-layer MLP of width 512 (default) or an LSTM LM of 8 layers\n"
    "  --workers K        workers (default 2)\n"
    "  --microbatches M   a multiple of K (default 8)\n"
    "  --batch N          samples per step (default 64)\n"
    "  --steps N          measured steps per configuration, after one warm-up (default 7)\n"
    "  --threads N        intra-op threads (default 1)\n";

struct Config {
  std::string label, schedule;
  bool recompute = false;
  std::unique_ptr<conveyor::Pipeline> pipe;
  std::vector<double> wall, bubble;
  conveyor::StepResult last;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  int64_t workers = args.workers, microbatches = args.microbatches, steps = args.steps, threads = args.threads;
  conveyor::examples::Flags flags;
  flags.text("--model", &args.model).integer("--workers", &workers, 1, 64);
  flags.integer("--microbatches", &microbatches, 1, 4096).integer("--batch", &args.batch, 1, 1 << 20);
  flags.integer("--steps", &steps, 1, 1000).integer("--threads", &threads, 1, 256);
  try {
    if (!flags.parse(argc, argv)) {
      std::cout << kHelp;
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_schedules: " << e.what() << "\n";
    return 2;
  }
  args.workers = static_cast<int>(workers), args.microbatches = static_cast<int>(microbatches);
  args.steps = static_cast<int>(steps), args.threads = static_cast<int>(threads);
  if (args.model != "mlp" && args.model != "lstm") {
    std::cerr << "--model expects mlp or lstm, got '" << args.model << "'\n";
    return 2;
  }
  torch::set_num_threads(args.threads);
  const bool lstm = args.model == "lstm";
  torch::manual_seed(0);
  const at::Tensor x = lstm ? torch::randint(2000, {args.batch, 32}) : torch::randn({args.batch, 512});
  const at::Tensor y = lstm ? torch::randint(2000, {args.batch, 32}) : torch::randn({args.batch, 512});
  const conveyor::LossFn loss = [lstm](const at::Tensor& out, const at::Tensor& t) {
    return lstm ? torch::nn::functional::cross_entropy(out.reshape({-1, out.size(-1)}), t.reshape({-1}))
                : torch::mse_loss(out, t);
  };

  std::vector<Config> configs;
  for (const auto& [label, schedule, recompute] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"sequential", "sequential", false},
           {"gpipe", "gpipe", false},
           {"gpipe + recompute", "gpipe", true},
           {"1f1b", "1f1b", false},
           {"1f1b + recompute", "1f1b", true},
           {"interleaved (v=2)", "interleaved", false},
           {"zb-h1", "zb-h1", false},
           {"zb-interleaved (v=2)", "zb-interleaved", false},
           {"zb-v", "zb-v", false},
           {"v-half", "v-half", false},
           {"v-min", "v-min", false},
           {"dualpipev", "dualpipev", false}}) {
    torch::manual_seed(1);
    Config c{label, schedule, recompute, nullptr, {}, {}, {}};
    c.pipe = std::make_unique<conveyor::Pipeline>(make_model(args.model), conveyor::PipelineOptions()
                                                                              .workers(args.workers)
                                                                              .microbatches(args.microbatches)
                                                                              .schedule(schedule)
                                                                              .recompute(recompute)
                                                                              .channel_capacity(4));
    c.last = c.pipe->train_step(x, y, loss);  // warm-up
    configs.push_back(std::move(c));
  }
  // Schedules synthesised from measured action times, each run as text on
  // the split it was measured on: F, I and W from a run of split backwards,
  // B from a run of whole ones.
  const auto costs_of = [&](const std::string& schedule) {
    for (const auto& c : configs) {
      if (c.schedule == schedule && !c.recompute) return measured_costs(c.last);
    }
    throw std::logic_error("bench_schedules: no run of " + schedule);
  };
  const auto synthesised = [&](const std::string& label, int chunks, const std::string& split,
                               const std::string& whole, double cap) {
    const conveyor::schedules::StageCosts measured = costs_of(split);
    conveyor::schedules::SynthesisProblem problem;
    problem.backward = costs_of(whole).backward;
    problem.workers = args.workers;
    problem.chunks = chunks;
    problem.microbatches = args.microbatches;
    problem.forward = measured.forward;
    for (size_t k = 0; k < measured.forward.size(); ++k) {
      problem.weight.push_back(measured.weight_of(static_cast<int>(k)));
      problem.input.push_back(measured.input_of(static_cast<int>(k)));
    }
    problem.memory_cap = cap;
    problem.channel_capacity = 4;
    const auto synthesis = conveyor::schedules::synthesise(problem);
    torch::manual_seed(1);
    Config s{label, "synthesised", false, nullptr, {}, {}, {}};
    s.pipe = std::make_unique<conveyor::Pipeline>(
        make_model(args.model), conveyor::PipelineOptions()
                                    .workers(args.workers)
                                    .microbatches(args.microbatches)
                                    .schedule_text(synthesis.schedule.str())
                                    .channel_capacity(4));
    s.last = s.pipe->train_step(x, y, loss);  // warm-up
    configs.push_back(std::move(s));
  };
  // On one chunk a worker, from zb-h1's and 1f1b's runs, at half of 1F1B's
  // memory (micro-batches a worker keeps), 1F1B's (K) and twice it.
  for (const int cap : {std::max(1, (args.workers + 1) / 2), args.workers, 2 * args.workers}) {
    synthesised("synthesised, cap " + std::to_string(cap) +
                    (cap == args.workers ? " (1F1B's memory)" : cap < args.workers ? " (half)" : " (twice)"),
                1, "zb-h1", "1f1b", cap);
  }
  // In a V, from zb-v's and dualpipev's runs, at the named V schedules' caps
  // (chunk activations a worker keeps): shaped for the measured costs where
  // the named ones take every chunk's F, I and W as equal.
  std::vector<std::pair<double, std::string>> v_caps;  // each cap once, with the names that hold it
  for (const char* name : {"v-min", "v-half", "zb-v"}) {
    const double cap = conveyor::schedules::v_memory_cap(name, args.workers);
    if (!v_caps.empty() && v_caps.back().first == cap) {
      v_caps.back().second += std::string(", ") + name + "'s";
    } else {
      v_caps.emplace_back(cap, std::string(name) + "'s");
    }
  }
  for (const auto& [cap, names] : v_caps) {
    synthesised("synthesised V, cap " + std::to_string(static_cast<int>(cap)) + " (" + names + ")", 2, "zb-v",
                "dualpipev", cap);
  }
  for (int s = 0; s < args.steps; ++s) {
    for (auto& c : configs) {
      for (const auto& p : c.pipe->parameters()) p.mutable_grad() = at::Tensor();
      c.last = c.pipe->train_step(x, y, loss);
      c.wall.push_back(c.last.wall_seconds);
      c.bubble.push_back(c.last.bubble_fraction);
    }
  }
  std::printf("model %s, batch %lld, K = %d workers, M = %d, %u hardware threads, %d intra-op thread(s); "
              "median of %d steps taking turns\n\n",
              args.model.c_str(), static_cast<long long>(args.batch), args.workers, args.microbatches,
              std::thread::hardware_concurrency(), args.threads, args.steps);
  std::printf("| schedule | measured ms | bubble | simulated ms | bubble | measured / simulated | peak stash KiB "
              "(per piece) |\n|---|---|---|---|---|---|---|\n");
  for (const auto& c : configs) {
    const auto sim = conveyor::schedules::simulate(c.pipe->schedule(), measured_costs(c.last));
    std::string stash;
    for (size_t k = 0; k < c.last.peak_stash_bytes.size(); ++k) {
      stash += (k ? " / " : "") + std::to_string(c.last.peak_stash_bytes[k] / 1024);
    }
    const double wall = median(c.wall);
    std::printf("| %s | %.1f | %.1f%% | %.1f | %.1f%% | %.2f | %s |\n", c.label.c_str(), wall * 1e3,
                100 * median(c.bubble), sim.makespan * 1e3, 100 * sim.bubble_fraction, wall / sim.makespan,
                stash.c_str());
  }
  return 0;
}
