// conveyor::FusedLSTM against torch::nn::LSTM (cuDNN on CUDA): forward and
// forward+backward times, same dtype, same weights; each of the fused
// kernels forced (on CUDA every kernel the op has, side by side), and
// FusedLSTM as dispatched by the table (ops/dispatch/fused_dispatch.h).
// --table-out writes the measured rows of a dispatch table, naming the
// fastest kernel. Run with --help for the flags.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_lstm/fused_lstm.h"
#include "ops/fused_lstm/fused_lstm_module.h"

#include "alternated_timing.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Shape {
  int64_t batch, seq, hidden, layers;
};

struct Flags {
  int warmup = 3;
  int repeats = 10;
  std::string dtype = "all";  // bf16, fp16, fp32 or all
  bool force_cpu = false;
  bool grid = false;      // the dispatch grid of shapes instead of the showcase ones
  bool sweep = false;     // micro-batch sizes at hidden 512 and 1024
  std::string table_out;  // write dispatch-table rows here
};

void print_help(const char* argv0) {
  std::printf(
      "Usage: %s [--warmup N] [--repeats N] [--dtype bf16|fp16|fp32|all] [--cpu] [--grid | --sweep]\n"
      "       [--table-out FILE]\n\n"
      "Times conveyor::FusedLSTM against torch::nn::LSTM with the same weights and dtype,\n"
      "forward only (no grad) and forward+backward (the median of --repeats runs after\n"
      "--warmup runs).\n\n"
      "On CUDA (timed with CUDA events) the shapes are (batch, seq, hidden, layers) =\n"
      "(64,35,650,2) (128,50,1024,4) (8,100,1024,2) (1,100,512,1), input size = hidden,\n"
      "in bfloat16 and float32; torch::nn::LSTM then runs cuDNN (TF32 for float32 where\n"
      "PyTorch allows it, as the fused kernels do). Without a CUDA device, or with --cpu,\n"
      "it runs the CPU reference path at small shapes in float32.\n\n"
      "  --warmup N   untimed runs before timing (default 3)\n"
      "  --repeats N  timed runs; the median is reported (default 10)\n"
      "  --dtype D    bf16, fp16, fp32 or all (default all: bf16 and fp32, and fp16 with --sweep;\n"
      "               CPU runs fp32 only)\n"
      "  --cpu        use the CPU even when CUDA is available\n"
      "  --grid       the dispatch grid: batch 1..128 x hidden 256..1024 x layers 1,2 on CUDA\n"
      "               (batch 1..64 x hidden 64..256, one layer, on the CPU), seq 50 (20 on CPU)\n"
      "  --sweep      pipeline micro-batches: batch 1, 2, 4, 8, 16 x hidden 512, 1024, one layer,\n"
      "               seq 100, in bf16, fp16 and fp32 (fp16 is where PyTorch turns on cuDNN's own\n"
      "               persistent kernel)\n"
      "  --table-out F  write a dispatch-table row per shape, dtype and mode to F: fused, naming\n"
      "               the fastest kernel, where that kernel is over 3%% faster than torch, else\n"
      "               reference (ops/dispatch/fused_dispatch_table.txt is made so)\n\n"
      "Columns: one per fused kernel, forced (on CUDA every kernel the op has: see\n"
      "ops/dispatch/fused_dispatch.h; each falls back to the per-step kernels where it\n"
      "does not fit); torch = torch::nn::LSTM; disp = FusedLSTM as the current table\n"
      "sends it (what swap_fused_ops gives a model); best = the fastest kernel and\n"
      "torch's time over its time; disp/torch = the dispatched time over torch's (<= 1.02\n"
      "is the target); |diff| = the fastest kernel's largest output difference from\n"
      "torch's. All alternate run by run, so a slow spell of the machine hits all alike.\n",
      argv0);
}

bool parse_flags(int argc, char** argv, Flags& flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      print_help(argv[0]);
      return false;
    } else if (arg == "--warmup") {
      flags.warmup = std::stoi(value());
    } else if (arg == "--repeats") {
      flags.repeats = std::max(1, std::stoi(value()));
    } else if (arg == "--dtype") {
      flags.dtype = value();
      if (flags.dtype != "bf16" && flags.dtype != "fp16" && flags.dtype != "fp32" && flags.dtype != "all") {
        throw std::invalid_argument("--dtype must be bf16, fp16, fp32 or all, got " + flags.dtype);
      }
    } else if (arg == "--cpu") {
      flags.force_cpu = true;
    } else if (arg == "--grid") {
      flags.grid = true;
    } else if (arg == "--sweep") {
      flags.sweep = true;
    } else if (arg == "--table-out") {
      flags.table_out = value();
    } else {
      throw std::invalid_argument("unknown flag " + arg + " (see --help)");
    }
  }
  if (flags.grid && flags.sweep) throw std::invalid_argument("--grid and --sweep are two different sets of shapes");
  return true;
}

constexpr double kMargin = 1.03;  // a table row says fused when fused * 1.03 < torch

struct Timing {
  std::vector<double> kernel_ms;  // per kernel of `kernels`
  double torch_ms = 0, dispatched_ms = 0;
  size_t best = 0;        // the fastest kernel
  double max_diff = 0;    // its forward output against torch's
};

template <typename Module>
std::function<void()> step(Module& m, const at::Tensor& x, const at::Tensor& grad, bool backward) {
  return [&m, x, grad, backward] {
    if (!backward) {
      torch::NoGradGuard no_grad;
      m->forward(x);
      return;
    }
    std::get<0>(m->forward(x)).backward(grad);
  };
}

// `kernels`: the fused kernels to force one by one ("" = the only one, on the CPU).
Timing run_case(const Shape& s, torch::Dtype dtype, const torch::Device& device, bool backward,
                const std::vector<std::string>& kernels, const Flags& flags) {
  const auto options = torch::nn::LSTMOptions(s.hidden, s.hidden).num_layers(s.layers);
  torch::nn::LSTM reference(options);
  conveyor::FusedLSTM fused(options);
  {
    torch::NoGradGuard no_grad;
    const auto theirs = reference->named_parameters();
    for (auto& p : fused->named_parameters()) p.value().copy_(theirs[p.key()]);
  }
  reference->to(device, dtype);
  fused->to(device, dtype);
  const auto tensor_options = torch::TensorOptions().dtype(dtype).device(device);
  const at::Tensor x = torch::randn({s.seq, s.batch, s.hidden}, tensor_options);
  const at::Tensor grad = torch::randn({s.seq, s.batch, s.hidden}, tensor_options);
  const auto fused_step = step(fused, x, grad, backward);
  auto forced = [&fused_step](std::string kernel) -> std::function<void()> {
    return [&fused_step, kernel] {
      conveyor::ScopedDispatch fused_path(conveyor::DispatchPolicy::kFused);
      std::optional<conveyor::ScopedFusedKernel> only;
      if (!kernel.empty()) only.emplace("lstm", kernel);
      fused_step();
    };
  };
  std::vector<std::function<void()>> runs;
  for (const auto& k : kernels) runs.push_back(forced(k));
  runs.push_back(step(reference, x, grad, backward));
  runs.push_back(fused_step);
  const auto ms = conveyor::bench::alternated_median_ms(device.is_cuda(), flags.warmup, flags.repeats, runs);
  Timing t;
  t.kernel_ms.assign(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(kernels.size()));
  t.torch_ms = ms[kernels.size()];
  t.dispatched_ms = ms[kernels.size() + 1];
  t.best = static_cast<size_t>(std::min_element(t.kernel_ms.begin(), t.kernel_ms.end()) - t.kernel_ms.begin());
  {
    torch::NoGradGuard no_grad;
    conveyor::ScopedDispatch fused_path(conveyor::DispatchPolicy::kFused);
    std::optional<conveyor::ScopedFusedKernel> only;
    if (!kernels[t.best].empty()) only.emplace("lstm", kernels[t.best]);
    const at::Tensor got = std::get<0>(fused->forward(x)).to(torch::kDouble);
    const at::Tensor want = std::get<0>(reference->forward(x)).to(torch::kDouble);
    t.max_diff = (got - want).abs().max().item<double>();
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    if (!parse_flags(argc, argv, flags)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fused_lstm: %s\n", e.what());
    return 2;
  }

  bool use_cuda = !flags.force_cpu && torch::cuda::is_available();
#ifndef CONVEYOR_WITH_CUDA
  if (use_cuda) std::printf("note: CUDA is available but Conveyor was built without CUDA kernels; using the CPU\n");
  use_cuda = false;
#endif
  std::vector<Shape> shapes;
  std::vector<std::pair<std::string, torch::Dtype>> dtypes;
  if (flags.grid) {
    for (int64_t layers : use_cuda ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1}) {
      for (int64_t hidden : use_cuda ? std::vector<int64_t>{256, 512, 1024} : std::vector<int64_t>{64, 256}) {
        const auto batches =
            use_cuda ? std::vector<int64_t>{1, 4, 8, 16, 32, 64, 128} : std::vector<int64_t>{1, 4, 16, 64};
        for (int64_t batch : batches) {
          shapes.push_back({batch, use_cuda ? 50 : 20, hidden, layers});
        }
      }
    }
  }
  if (flags.sweep) {
    for (int64_t hidden : use_cuda ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{64, 128}) {
      for (int64_t batch : {1, 2, 4, 8, 16}) shapes.push_back({batch, use_cuda ? 100 : 20, hidden, 1});
    }
  }
  // The fused kernels, forced one by one: on CUDA every kernel of the op.
  std::vector<std::string> kernels{""};
  if (use_cuda) {
    if (shapes.empty()) shapes = {{64, 35, 650, 2}, {128, 50, 1024, 4}, {8, 100, 1024, 2}, {1, 100, 512, 1}};
    if (flags.dtype == "all" || flags.dtype == "bf16") dtypes.emplace_back("bf16", torch::kBFloat16);
    if (flags.dtype == "fp16" || (flags.dtype == "all" && flags.sweep)) dtypes.emplace_back("fp16", torch::kHalf);
    if (flags.dtype == "all" || flags.dtype == "fp32") dtypes.emplace_back("fp32", torch::kFloat32);
    kernels = conveyor::fused_kernel_names("lstm");
    std::printf("device: CUDA; reference: torch::nn::LSTM (cuDNN), cuDNN TF32 %s\n",
                conveyor::lstm_allows_tf32() ? "allowed (torch default; the fused kernels follow it)" : "off");
  } else {
    if (shapes.empty()) shapes = {{16, 35, 256, 2}, {4, 35, 128, 1}};
    dtypes.emplace_back("fp32", torch::kFloat32);
    std::printf("device: CPU (%s); fused = the CPU reference path, reference = torch::nn::LSTM on CPU\n",
                flags.force_cpu ? "--cpu" : "no CUDA device available");
  }
  const torch::Device device = use_cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::manual_seed(0);

  std::ofstream table;
  if (!flags.table_out.empty()) {
    table.open(flags.table_out);
    if (!table) {
      std::fprintf(stderr, "bench_fused_lstm: cannot write %s\n", flags.table_out.c_str());
      return 2;
    }
    table << "# bench_fused_lstm" << (flags.grid ? " --grid" : flags.sweep ? " --sweep" : "") << " on "
          << conveyor::dispatch_device_name(device) << ": median of " << flags.repeats << " runs\n";
  }
  const std::string device_token = conveyor::dispatch_device_token(conveyor::dispatch_device_name(device));
  std::printf("%-5s %5s %5s %6s %6s  %-7s", "dtype", "batch", "seq", "hidden", "layers", "mode");
  for (const auto& k : kernels) std::printf(" %14s", (k.empty() ? "fused" : k).c_str());
  std::printf(" %9s %9s  %-14s %7s %10s %9s\n", "torch ms", "disp ms", "best", "speedup", "disp/torch", "|diff|");
  for (const auto& [name, dtype] : dtypes) {
    for (const auto& s : shapes) {
      for (bool backward : {false, true}) {
        const Timing t = run_case(s, dtype, device, backward, kernels, flags);
        std::printf("%-5s %5lld %5lld %6lld %6lld  %-7s", name.c_str(), static_cast<long long>(s.batch),
                    static_cast<long long>(s.seq), static_cast<long long>(s.hidden), static_cast<long long>(s.layers),
                    backward ? "fwd+bwd" : "fwd");
        for (double ms : t.kernel_ms) std::printf(" %14.3f", ms);
        const double best_ms = t.kernel_ms[t.best];
        std::printf(" %9.3f %9.3f  %-14s %6.2fx %10.3f %9.2e\n", t.torch_ms, t.dispatched_ms,
                    (kernels[t.best].empty() ? "fused" : kernels[t.best]).c_str(), t.torch_ms / best_ms,
                    t.dispatched_ms / t.torch_ms, t.max_diff);
        if (table.is_open()) {
          // The fused kernel only where it is clearly faster: the replaced op is the safe default.
          const bool fused_wins = best_ms * kMargin < t.torch_ms;
          conveyor::DispatchRow row{"lstm", device_token, name,
                                    fused_wins ? conveyor::FusedPath::kFused : conveyor::FusedPath::kReference,
                                    {}, {}, fused_wins ? kernels[t.best] : ""};
          row.shape = {{"batch", double(s.batch)}, {"seq", double(s.seq)},       {"input", double(s.hidden)},
                       {"hidden", double(s.hidden)}, {"layers", double(s.layers)}, {"train", backward ? 1.0 : 0.0}};
          row.measured = {{"fused_ms", best_ms}, {"reference_ms", t.torch_ms}};
          table << row.str() << std::endl;  // row by row: a run cut short keeps what it measured
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
