// conveyor::fused_attention against at::scaled_dot_product_attention:
// forward and forward+backward time and TFLOP/s, median over timed runs after
// warm-up. On CUDA: bfloat16, SDPA with the flash backend forced and with the
// default backend choice, timed with CUDA events. Without CUDA: the CPU
// reference against SDPA on CPU, at a small size, timed with a steady clock.
// "dispatched" is conveyor::dispatched_attention, which FusedMultiheadAttention calls:
// the path the dispatch table picks (ops/dispatch/fused_dispatch.h);
// --table-out writes the measured rows of such a table. With a key-padding
// mask (--mask padded: half the batch entries padded by a quarter of their
// keys), the fused kernel given the mask against SDPA given the same mask
// (masked_reference_attention, the reference a masked call dispatches to)
// and against SDPA run on each sequence alone at its own length.

#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_attention/fused_attention.h"

#include "alternated_timing.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Options {
  int64_t batch = 8;
  int64_t heads = 16;
  std::vector<int64_t> seq_lens = {512, 1024, 2048, 4096, 8192};
  std::vector<int64_t> head_dims = {64, 128};
  int warmup = 3;
  int iters = 10;
  bool cpu = false;
  std::vector<std::string> masks = {"none", "padded"};
  std::string table_out;
};

void print_help() {
  std::printf(
      "bench_fused_attention: conveyor::fused_attention vs at::scaled_dot_product_attention\n"
      "\n"
      "  --batch N        batch size (default 8; 2 on CPU)\n"
      "  --heads N        heads (default 16; 4 on CPU)\n"
      "  --seq A,B,...    sequence lengths (default 512,...,8192; 64,128,256,512 on CPU)\n"
      "  --head-dim A,..  head dims (default 64,128; 64 on CPU)\n"
      "  --warmup N       untimed runs first (default 3)\n"
      "  --iters N        timed runs; the median is reported (default 10)\n"
      "  --cpu            run the CPU comparison even when CUDA is present\n"
      "  --mask M         none, padded or both (default both): padded gives half the batch entries\n"
      "                   a key-padding mask over the last quarter of their keys (seq <= 4096)\n"
      "  --table-out F    write a dispatch-table row per shape and mode (forward, training)\n"
      "                   to F: conveyor where it is over 3%% faster than SDPA's default\n"
      "                   choice, else reference\n"
      "  --help           this text\n"
      "\n"
      "FLOPs: forward 4*B*H*S^2*D (halved when causal), backward 2.5x forward.\n"
      "On CUDA the inputs are bfloat16 and SDPA runs twice: with only the flash\n"
      "backend enabled, and with PyTorch's default backend choice. Without CUDA\n"
      "the CPU reference (float32) is compared with SDPA on CPU.\n");
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

Options parse(int argc, char** argv, bool cuda) {
  Options o;
  bool sizes_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value (see --help)\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      print_help();
      std::exit(0);
    } else if (a == "--batch") {
      o.batch = std::stoll(value());
      sizes_given = true;
    } else if (a == "--heads") {
      o.heads = std::stoll(value());
      sizes_given = true;
    } else if (a == "--seq") {
      o.seq_lens = parse_list(value());
      sizes_given = true;
    } else if (a == "--head-dim") {
      o.head_dims = parse_list(value());
      sizes_given = true;
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value());
    } else if (a == "--iters") {
      o.iters = std::max(1, std::stoi(value()));
    } else if (a == "--cpu") {
      o.cpu = true;
    } else if (a == "--mask") {
      const std::string m = value();
      if (m != "none" && m != "padded" && m != "both") {
        std::fprintf(stderr, "--mask must be none, padded or both, got %s\n", m.c_str());
        std::exit(2);
      }
      o.masks = m == "both" ? std::vector<std::string>{"none", "padded"} : std::vector<std::string>{m};
    } else if (a == "--table-out") {
      o.table_out = value();
    } else {
      std::fprintf(stderr, "unknown argument %s (see --help)\n", a.c_str());
      std::exit(2);
    }
  }
  if ((o.cpu || !cuda) && !sizes_given) {  // the math path forms S x S scores: keep it small
    o.batch = 2;
    o.heads = 4;
    o.seq_lens = {64, 128, 256, 512};
    o.head_dims = {64};
  }
  return o;
}

using Attention = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool)>;

struct Row {
  std::string name;
  double forward_ms = 0, training_ms = 0, max_diff = 0;
};

// Forward (no grad) and forward+backward times of every kernel, alternated.
std::vector<Row> measure(const std::vector<std::pair<std::string, Attention>>& kernels, const at::Tensor& q,
                         const at::Tensor& k, const at::Tensor& v, const at::Tensor& grad, bool causal,
                         const at::Tensor& reference, const Options& o, bool cuda) {
  std::vector<Row> rows;
  std::vector<std::function<void()>> forwards, trainings;
  const at::Tensor qg = q.detach().requires_grad_(true);
  const at::Tensor kg = k.detach().requires_grad_(true);
  const at::Tensor vg = v.detach().requires_grad_(true);
  for (const auto& [name, attention] : kernels) {
    Row row{name};
    {
      torch::NoGradGuard no_grad;
      row.max_diff = (attention(q, k, v, causal).to(torch::kFloat) - reference).abs().max().item<double>();
    }
    rows.push_back(row);
    forwards.push_back([&, attention] {
      torch::NoGradGuard no_grad;
      attention(q, k, v, causal);
    });
    trainings.push_back([&, attention] {
      for (const at::Tensor& t : {qg, kg, vg}) t.mutable_grad().reset();
      attention(qg, kg, vg, causal).backward(grad);
    });
  }
  const auto forward_ms = conveyor::bench::alternated_median_ms(cuda, o.warmup, o.iters, forwards);
  const auto training_ms = conveyor::bench::alternated_median_ms(cuda, o.warmup, o.iters, trainings);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].forward_ms = forward_ms[i];
    rows[i].training_ms = training_ms[i];
  }
  return rows;
}

// Rates in TFLOP/s on CUDA, GFLOP/s on CPU (flops_per_unit = 1e12 or 1e9).
void print_rows(const std::vector<Row>& rows, const Options& o, int64_t s, int64_t d, bool causal, bool masked,
                double flops_per_unit) {
  const double forward_flops = 4.0 * o.batch * o.heads * s * s * d * (causal ? 0.5 : 1.0);
  for (const Row& r : rows) {
    std::printf("%6lld %4lld %-6s %-6s | %-14s | %9.3f %8.2f | %9.3f %8.2f | %9.2e\n", static_cast<long long>(s),
                static_cast<long long>(d), causal ? "yes" : "no", masked ? "padded" : "none", r.name.c_str(), r.forward_ms,
                forward_flops / (r.forward_ms * 1e-3 * flops_per_unit), r.training_ms,
                3.5 * forward_flops / (r.training_ms * 1e-3 * flops_per_unit), r.max_diff);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool have_cuda = torch::cuda::is_available();
  const Options o = parse(argc, argv, have_cuda);
  const bool cuda = have_cuda && !o.cpu;
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;
  const auto dtype = cuda ? torch::kBFloat16 : torch::kFloat32;
  if (!have_cuda) {
    std::printf(
        "CUDA is absent: timing the CPU reference against SDPA on CPU (float32); the CUDA kernels "
        "are not measured.\n");
  }
  std::printf(
      "device %s, dtype %s, batch %lld, heads %lld, warm-up %d, median of %d runs; max|diff| is against "
      "SDPA's default output\n",
      cuda ? "cuda" : "cpu", cuda ? "bfloat16" : "float32", static_cast<long long>(o.batch),
      static_cast<long long>(o.heads), o.warmup, o.iters);
  const char* rate = cuda ? "TFLOP/s" : "GFLOP/s";
  std::printf("%6s %4s %-6s %-6s | %-14s | %9s %8s | %9s %8s | %9s\n", "seq", "dim", "causal", "mask", "kernel",
              "fwd ms", rate, "f+b ms", rate, "max|diff|");
  std::printf("(TFLOP/s count every score, padded or not; max|diff| is against SDPA given the same mask)\n");

  std::ofstream table;
  if (!o.table_out.empty()) {
    table.open(o.table_out);
    if (!table) {
      std::fprintf(stderr, "bench_fused_attention: cannot write %s\n", o.table_out.c_str());
      return 2;
    }
    table << "# bench_fused_attention on " << conveyor::dispatch_device_name(device) << ": median of " << o.iters
          << " runs\n";
  }
  const std::string device_token = conveyor::dispatch_device_token(conveyor::dispatch_device_name(device));
  const std::string dtype_name = conveyor::dispatch_dtype_name(dtype);
  const Attention sdpa = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
  };
  auto& ctx = at::globalContext();
  const bool flash0 = ctx.userEnabledFlashSDP(), mem0 = ctx.userEnabledMemEfficientSDP();
  const bool math0 = ctx.userEnabledMathSDP(), cudnn0 = ctx.userEnabledCuDNNSDP();
  auto restore_backends = [&] {
    ctx.setSDPUseFlash(flash0);
    ctx.setSDPUseMemEfficient(mem0);
    ctx.setSDPUseMath(math0);
    ctx.setSDPUseCuDNN(cudnn0);
  };

  // SDPA with the flash backend alone, the others restored after each call.
  const Attention sdpa_flash = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
    ctx.setSDPUseFlash(true);
    ctx.setSDPUseMemEfficient(false);
    ctx.setSDPUseMath(false);
    ctx.setSDPUseCuDNN(false);
    at::Tensor out;
    try {
      out = sdpa(q, k, v, causal);
    } catch (...) {
      restore_backends();
      throw;
    }
    restore_backends();
    return out;
  };

  torch::manual_seed(0);
  for (const std::string& mask_kind : o.masks) {
    const bool masked = mask_kind == "padded";
    for (const int64_t s : o.seq_lens) {
      if (masked && s > 4096) continue;
      for (const int64_t d : o.head_dims) {
        for (const bool causal : {false, true}) {
          const auto options = torch::TensorOptions().device(device).dtype(dtype);
          const at::Tensor q = torch::randn({o.batch, o.heads, s, d}, options);
          const at::Tensor k = torch::randn({o.batch, o.heads, s, d}, options);
          const at::Tensor v = torch::randn({o.batch, o.heads, s, d}, options);
          const at::Tensor grad = torch::randn({o.batch, o.heads, s, d}, options);
          // Half the batch entries (the odd ones) padded by a quarter of their keys.
          std::vector<int64_t> lengths(static_cast<size_t>(o.batch), s);
          at::Tensor mask = torch::zeros({o.batch, s}, torch::TensorOptions().dtype(torch::kBool));
          for (int64_t b = 1; b < o.batch; b += 2) {
            lengths[static_cast<size_t>(b)] = s - s / 4;
            mask[b].slice(0, s - s / 4).fill_(true);
          }
          mask = mask.to(device);
          const std::optional<at::Tensor> m = masked ? std::optional<at::Tensor>(mask) : std::nullopt;
          const Attention fused_m = [m](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool c) {
            return conveyor::fused_attention(q, k, v, m, c);
          };
          const Attention dispatched_m = [m](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool c) {
            return conveyor::dispatched_attention(q, k, v, m, c);
          };
          const Attention sdpa_m = [&, m](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool c) {
            return m ? conveyor::masked_reference_attention(q, k, v, *m, c) : sdpa(q, k, v, c);
          };
          // SDPA on each sequence alone at its own length (no mask): the padding's cost avoided.
          const Attention one_by_one = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool c) {
            std::vector<at::Tensor> outs;
            for (int64_t b = 0; b < o.batch; ++b) {
              const int64_t n = lengths[static_cast<size_t>(b)];
              outs.push_back(sdpa(q.narrow(0, b, 1), k.narrow(0, b, 1).narrow(2, 0, n), v.narrow(0, b, 1).narrow(2, 0, n), c));
            }
            return at::cat(outs, 0);
          };
          at::Tensor reference;
          {
            torch::NoGradGuard no_grad;
            reference = sdpa_m(q, k, v, causal).to(torch::kFloat);  // max|diff| is measured against this
          }
          std::vector<Row> rows;
          try {
            std::vector<std::pair<std::string, Attention>> kernels{{"conveyor", fused_m}};
            if (cuda && !masked) kernels.emplace_back("sdpa flash", sdpa_flash);
            kernels.emplace_back(masked ? "sdpa masked" : cuda ? "sdpa default" : "sdpa", sdpa_m);
            if (masked) kernels.emplace_back("sdpa each seq", one_by_one);
            kernels.emplace_back("dispatched", dispatched_m);
            rows = measure(kernels, q, k, v, grad, causal, reference, o, cuda);
          } catch (const std::exception& e) {
            restore_backends();
            std::printf("%6lld %4lld %-6s %-6s | failed: %s\n", static_cast<long long>(s), static_cast<long long>(d),
                        causal ? "yes" : "no", mask_kind.c_str(), e.what());
            continue;
          }
          print_rows(rows, o, s, d, causal, masked, cuda ? 1e12 : 1e9);
          const Row& ours = rows.front();
          const Row& reference_row = *std::find_if(rows.begin(), rows.end(), [](const Row& r) {
            return r.name == "sdpa masked" || r.name == "sdpa default" || r.name == "sdpa";
          });
          for (const bool train : {false, true}) {
            if (!table.is_open()) break;
            const double fused_ms = train ? ours.training_ms : ours.forward_ms;
            const double reference_ms = train ? reference_row.training_ms : reference_row.forward_ms;
            conveyor::DispatchRow row{"attention", device_token, dtype_name,
                                      fused_ms * 1.03 < reference_ms ? conveyor::FusedPath::kFused
                                                                     : conveyor::FusedPath::kReference,
                                      {}, {}};
            row.shape = {{"batch_heads", double(o.batch * o.heads)}, {"seq_q", double(s)}, {"seq_k", double(s)},
                         {"head_dim", double(d)}, {"causal", causal ? 1.0 : 0.0}, {"train", train ? 1.0 : 0.0}};
            if (masked) row.shape["mask"] = 1;
            row.measured = {{"fused_ms", fused_ms}, {"reference_ms", reference_ms}};
            table << row.str() << std::endl;  // row by row: a run cut short keeps what it measured
          }
        }
      }
    }
  }
  return 0;
}
