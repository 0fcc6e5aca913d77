// conveyor::FusedLSTM against torch::nn::LSTM (cuDNN on CUDA): forward and
// forward+backward throughput in tokens/s, same dtype, same weights.
// Run with --help for the flags.
#include "ops/fused_lstm/fused_lstm_module.h"

#include <torch/torch.h>

#ifdef CONVEYOR_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

struct Shape {
  int64_t batch, seq, hidden, layers;
};

struct Flags {
  int warmup = 3;
  int repeats = 10;
  std::string dtype = "all";  // bf16, fp32 or all
  bool force_cpu = false;
};

void print_help(const char* argv0) {
  std::printf(
      "Usage: %s [--warmup N] [--repeats N] [--dtype bf16|fp32|all] [--cpu]\n\n"
      "Times conveyor::FusedLSTM against torch::nn::LSTM with the same weights and dtype,\n"
      "forward only (no grad) and forward+backward, and prints tokens/s (batch*seq per\n"
      "second; the median of --repeats runs after --warmup runs).\n\n"
      "On CUDA (timed with CUDA events) the shapes are (batch, seq, hidden, layers) =\n"
      "(64,35,650,2) (128,50,1024,4) (8,100,1024,2) (1,100,512,1), input size = hidden,\n"
      "in bfloat16 and float32; torch::nn::LSTM then runs cuDNN. Without a CUDA device,\n"
      "or with --cpu, it runs the CPU reference path at small shapes in float32.\n\n"
      "  --warmup N   untimed runs before timing (default 3)\n"
      "  --repeats N  timed runs; the median is reported (default 10)\n"
      "  --dtype D    bf16, fp32 or all (default all; CPU runs fp32 only)\n"
      "  --cpu        use the CPU even when CUDA is available\n",
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
      if (flags.dtype != "bf16" && flags.dtype != "fp32" && flags.dtype != "all") {
        throw std::invalid_argument("--dtype must be bf16, fp32 or all, got " + flags.dtype);
      }
    } else if (arg == "--cpu") {
      flags.force_cpu = true;
    } else {
      throw std::invalid_argument("unknown flag " + arg + " (see --help)");
    }
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Median milliseconds of fn over `repeats` runs after `warmup` runs.
double time_ms(const torch::Device& device, const Flags& flags, const std::function<void()>& fn) {
  for (int i = 0; i < flags.warmup; ++i) fn();
  std::vector<double> ms;
#ifdef CONVEYOR_WITH_CUDA
  if (device.is_cuda()) {
    cudaEvent_t start, stop;
    C10_CUDA_CHECK(cudaEventCreate(&start));
    C10_CUDA_CHECK(cudaEventCreate(&stop));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < flags.repeats; ++i) {
      C10_CUDA_CHECK(cudaEventRecord(start, stream));
      fn();
      C10_CUDA_CHECK(cudaEventRecord(stop, stream));
      C10_CUDA_CHECK(cudaEventSynchronize(stop));
      float elapsed = 0;
      C10_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
      ms.push_back(elapsed);
    }
    C10_CUDA_CHECK(cudaEventDestroy(start));
    C10_CUDA_CHECK(cudaEventDestroy(stop));
    return median(ms);
  }
#endif
  (void)device;
  for (int i = 0; i < flags.repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

struct Timing {
  double fused_ms, torch_ms;
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

Timing run_case(const Shape& s, torch::Dtype dtype, const torch::Device& device, bool backward, const Flags& flags) {
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
  return {time_ms(device, flags, step(fused, x, grad, backward)),
          time_ms(device, flags, step(reference, x, grad, backward))};
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
  if (use_cuda) {
    shapes = {{64, 35, 650, 2}, {128, 50, 1024, 4}, {8, 100, 1024, 2}, {1, 100, 512, 1}};
    if (flags.dtype != "fp32") dtypes.emplace_back("bf16", torch::kBFloat16);
    if (flags.dtype != "bf16") dtypes.emplace_back("fp32", torch::kFloat32);
    std::printf("device: CUDA; reference: torch::nn::LSTM (cuDNN), cuDNN TF32 %s\n",
                at::globalContext().allowTF32CuDNN() ? "allowed (torch default)" : "off");
  } else {
    shapes = {{16, 35, 256, 2}, {4, 35, 128, 1}};
    dtypes.emplace_back("fp32", torch::kFloat32);
    std::printf("device: CPU (%s); fused = the CPU reference path, reference = torch::nn::LSTM on CPU\n",
                flags.force_cpu ? "--cpu" : "no CUDA device available");
  }
  const torch::Device device = use_cuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  torch::manual_seed(0);

  std::printf("%-5s %6s %5s %6s %6s  %-8s %10s %10s %14s %14s %8s\n", "dtype", "batch", "seq", "hidden", "layers",
              "mode", "fused ms", "torch ms", "fused tok/s", "torch tok/s", "speedup");
  for (const auto& [name, dtype] : dtypes) {
    for (const auto& s : shapes) {
      for (bool backward : {false, true}) {
        const Timing t = run_case(s, dtype, device, backward, flags);
        const double tokens = static_cast<double>(s.batch * s.seq);
        std::printf("%-5s %6lld %5lld %6lld %6lld  %-8s %10.3f %10.3f %14.0f %14.0f %7.2fx\n", name.c_str(),
                    static_cast<long long>(s.batch), static_cast<long long>(s.seq), static_cast<long long>(s.hidden),
                    static_cast<long long>(s.layers), backward ? "fwd+bwd" : "fwd", t.fused_ms, t.torch_ms,
                    tokens / (t.fused_ms / 1e3), tokens / (t.torch_ms / 1e3), t.torch_ms / t.fused_ms);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
