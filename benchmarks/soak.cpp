// Soak: many in-process training steps with a stage exception or a NaN loss
// injected every few steps (tests/fault_plans.h). Each failed step is skipped
// (the pipeline rolls back its weights and optimizer state) and training goes
// on. Checks, and exits 1 if any fails:
//   - every injected fault failed its step with the right error, and only those steps failed;
//   - the final weights equal, bit for bit, those of a run that never took the failed steps;
//   - resident memory after warm-up grows by at most --rss-bound-mib;
//   - the process has as many threads at the end as at warm-up, and after the
//     pipelines are gone as many as before they were built.
//
//   soak [--steps 1000] [--schedule pipedream] [--fault-every 4] [--seed 1]
//        [--warmup 100] [--rss-bound-mib 8]
#include "plugin/conveyor.h"
#include "tests/fault_plans.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using conveyor::Pipeline;
using conveyor::PipelineOptions;
using conveyor::testing::FaultKind;
using conveyor::testing::FaultPlan;

struct Flags {
  int steps = 1000;
  std::string schedule = "pipedream";
  int fault_every = 4;  // on average one step in this many fails
  uint32_t seed = 1;
  int warmup = 100;
  double rss_bound_mib = 8;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    if (name == "--steps") {
      f.steps = std::stoi(value);
    } else if (name == "--schedule") {
      f.schedule = value;
    } else if (name == "--fault-every") {
      f.fault_every = std::stoi(value);
    } else if (name == "--seed") {
      f.seed = static_cast<uint32_t>(std::stoul(value));
    } else if (name == "--warmup") {
      f.warmup = std::stoi(value);
    } else if (name == "--rss-bound-mib") {
      f.rss_bound_mib = std::stod(value);
    } else {
      throw std::invalid_argument("soak: unknown flag " + name);
    }
  }
  if (argc % 2 == 0) throw std::invalid_argument("soak: flag " + std::string(argv[argc - 1]) + " has no value");
  if (f.warmup >= f.steps) throw std::invalid_argument("soak: --warmup must be below --steps");
  return f;
}

double rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;  // in kB
  }
  return -1;
}

int threads() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) n += entry.exists() ? 1 : 0;
  return n;
}

bool asynchronous(const std::string& schedule) {
  return schedule == "pipedream" || schedule == "ddg" || schedule == "fr";
}

std::unique_ptr<Pipeline> make_pipeline(const std::string& schedule) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  model->to(torch::kFloat64);
  return std::make_unique<Pipeline>(
      model, PipelineOptions()
                 .workers(3)
                 .microbatches(4)
                 .schedule(schedule)
                 .timeout(std::chrono::seconds(10))
                 .trace(false)
                 .optimizer([](std::vector<at::Tensor> p) {
                   return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01).momentum(0.9));
                 })
                 .lr_schedule([](int64_t update) { return 0.01 / (1.0 + 0.001 * static_cast<double>(update)); })
                 .lr_schedule_unit(asynchronous(schedule) ? conveyor::UpdateUnit::kMicrobatch
                                                          : conveyor::UpdateUnit::kBatch));
}

void train(Pipeline& pipe, int step) {
  torch::manual_seed(10000 + step);
  const at::Tensor x = torch::randn({16, 8}, torch::kFloat64);
  const at::Tensor y = torch::tanh(x.narrow(1, 0, 3));
  pipe.train_step(x, y, [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); });
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  torch::set_num_threads(1);  // no intra-op pool: the thread count is the pipeline's own
  const int threads_before = threads();
  std::mt19937 rng(flags.seed);
  std::set<int> failed;
  int injected = 0, wrong = 0;
  double rss_warm = 0, rss_end = 0;
  int threads_warm = 0, threads_end = 0;
  std::vector<at::Tensor> final_weights;
  {
    auto pipe = make_pipeline(flags.schedule);
    conveyor::testing::PlannedFaults faults;
    conveyor::FaultInjectionScope scope(faults);
    for (int step = 0; step < flags.steps; ++step) {
      if (step == flags.warmup) {
        rss_warm = rss_mib();
        threads_warm = threads();
      }
      FaultPlan plan;
      if (rng() % flags.fault_every == 0) {
        const FaultKind kind = rng() % 2 == 0 ? FaultKind::kThrow : FaultKind::kNan;
        plan = conveyor::testing::draw_fault(kind, pipe->schedule(), rng);
        ++injected;
      }
      faults.arm(plan);
      std::vector<at::Tensor> before;
      if (plan.kind != FaultKind::kNone) {
        for (const auto& p : pipe->parameters()) before.push_back(p.detach().clone());
      }
      try {
        train(*pipe, step);
        if (plan.kind != FaultKind::kNone) {
          std::cerr << "step " << step << ": the injected " << fault_kind_name(plan.kind) << " did not fail it\n";
          ++wrong;
        }
      } catch (const conveyor::PipelineError& e) {
        failed.insert(step);
        const std::string message = e.what();
        const bool named = plan.kind == FaultKind::kThrow ? message.find("injected fault") != std::string::npos
                                                          : message.find("non-finite loss") != std::string::npos;
        const auto params = pipe->parameters();
        bool kept = plan.kind != FaultKind::kNone && faults.fired();
        for (size_t i = 0; kept && i < params.size(); ++i) kept = torch::equal(params[i], before[i]);
        if (!named || !kept) {
          std::cerr << "step " << step << ": " << (kept ? "" : "weights changed by the failed step; ") << message
                    << "\n";
          ++wrong;
        }
      }
      faults.disarm();
    }
    rss_end = rss_mib();
    threads_end = threads();
    for (const auto& p : pipe->parameters()) final_weights.push_back(p.detach().clone());
  }
  // The reference: the same pipeline that never takes the failed steps.
  bool equal = true;
  {
    auto reference = make_pipeline(flags.schedule);
    for (int step = 0; step < flags.steps; ++step) {
      if (!failed.count(step)) train(*reference, step);
    }
    const auto params = reference->parameters();
    equal = params.size() == final_weights.size();
    for (size_t i = 0; equal && i < params.size(); ++i) equal = torch::equal(params[i], final_weights[i]);
  }
  const int threads_after = threads();
  const double growth = rss_end - rss_warm;

  std::cout << "soak: " << flags.steps << " steps of " << flags.schedule << " (3 stages, 4 micro-batches), seed "
            << flags.seed << "\n"
            << "  faults injected      " << injected << " (a stage exception or a NaN loss)\n"
            << "  steps failed         " << failed.size() << ", recovered (rolled back, training went on) "
            << failed.size() - static_cast<size_t>(wrong) << "\n"
            << "  wrong outcomes       " << wrong << "\n"
            << "  RSS at warm-up       " << rss_warm << " MiB (step " << flags.warmup << ")\n"
            << "  RSS at the end       " << rss_end << " MiB (growth " << growth << " MiB, bound "
            << flags.rss_bound_mib << ")\n"
            << "  threads              " << threads_before << " before, " << threads_warm << " at warm-up, "
            << threads_end << " at the end, " << threads_after << " after\n"
            << "  final weights        " << (equal ? "equal" : "DIFFER from") << " a run without the failed steps\n";
  const bool ok = wrong == 0 && static_cast<int>(failed.size()) == injected && equal &&
                  growth <= flags.rss_bound_mib && threads_end == threads_warm && threads_after == threads_before;
  std::cout << (ok ? "PASS" : "FAIL") << "\n";
  return ok ? 0 : 1;
}
