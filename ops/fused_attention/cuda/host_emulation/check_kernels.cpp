// Runs the CUDA attention kernels (tensor-core and general paths, forward and
// backward) on the host emulation and compares them with a float64 reference,
// on shapes chosen to hit partial tiles, causal skipping, padding and fully
// masked rows. Exit status 0 when every comparison is within tolerance.
#include <cstdint>

namespace conveyor::attention::cuda {
// What the kernels' block-scope `extern __shared__ ... smem_raw[]` names here:
// one block runs at a time under emulated::launch().
alignas(128) unsigned char smem_raw[256 * 1024];
}  // namespace conveyor::attention::cuda

#include "ops/fused_attention/cuda/flash_backward_kernel.cuh"
#include "ops/fused_attention/cuda/flash_forward_kernel.cuh"
#include "ops/fused_attention/cuda/flash_forward_tiles_kernel.cuh"
#include "ops/fused_attention/cuda/simple_attention_kernels.cuh"

#include <cstdio>
#include <random>
#include <string>

using namespace conveyor::attention::cuda;

struct Problem {
  int B, H, Sq, Sk, D;
  bool causal;
  // 0 none, 1 random, 2 whole batch 0, 3 first key, 4 whole key blocks (keys
  // 64-127 of batch 0, 64 on of batch 1), 5 the first 70 keys
  int padding;
};

template <typename T>
T from_double(double x);
template <>
__half from_double<__half>(double x) {
  return __float2half_rn(static_cast<float>(x));
}
template <>
__nv_bfloat16 from_double<__nv_bfloat16>(double x) {
  return __float2bfloat16_rn(static_cast<float>(x));
}
template <>
float from_double<float>(double x) {
  return static_cast<float>(x);
}
template <>
double from_double<double>(double x) {
  return x;
}
double to_double(__half x) { return __half2float(x); }
double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
double to_double(float x) { return x; }
double to_double(double x) { return x; }

template <typename T>
ElementType element_type();
template <>
ElementType element_type<__half>() {
  return ElementType::kHalf;
}
template <>
ElementType element_type<__nv_bfloat16>() {
  return ElementType::kBFloat16;
}
template <>
ElementType element_type<float>() {
  return ElementType::kFloat;
}
template <>
ElementType element_type<double>() {
  return ElementType::kDouble;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, const std::vector<uint8_t>& mask,
                    double scale) {
  const int D = pr.D;
  Reference r;
  r.out.assign(q.size(), 0);
  r.lse.assign(static_cast<size_t>(pr.B) * pr.H * pr.Sq, 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  for (int b = 0; b < pr.B; ++b)
    for (int h = 0; h < pr.H; ++h) {
      const size_t qo = (static_cast<size_t>(b) * pr.H + h) * pr.Sq * D;
      const size_t ko = (static_cast<size_t>(b) * pr.H + h) * pr.Sk * D;
      for (int i = 0; i < pr.Sq; ++i) {
        std::vector<double> s(pr.Sk), p(pr.Sk, 0.0);
        double m = -INFINITY;
        for (int j = 0; j < pr.Sk; ++j) {
          const bool hidden = (pr.causal && j > i) || mask[static_cast<size_t>(b) * pr.Sk + j];
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[qo + i * D + d] * k[ko + j * D + d];
          s[j] = hidden ? -INFINITY : dot * scale;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;  // fully masked: zeros
        double sum = 0;
        for (int j = 0; j < pr.Sk; ++j) sum += (p[j] = std::exp(s[j] - m));
        for (int j = 0; j < pr.Sk; ++j) p[j] /= sum;
        r.lse[(static_cast<size_t>(b) * pr.H + h) * pr.Sq + i] = m + std::log(sum);
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int j = 0; j < pr.Sk; ++j) o += p[j] * v[ko + j * D + d];
          r.out[qo + i * D + d] = o;
        }
        double row_dot = 0;
        for (int d = 0; d < D; ++d) row_dot += dout[qo + i * D + d] * r.out[qo + i * D + d];
        for (int j = 0; j < pr.Sk; ++j) {
          if (p[j] == 0) continue;
          double dp = 0;
          for (int d = 0; d < D; ++d) dp += dout[qo + i * D + d] * v[ko + j * D + d];
          const double ds = p[j] * (dp - row_dot);
          for (int d = 0; d < D; ++d) {
            r.dq[qo + i * D + d] += scale * ds * k[ko + j * D + d];
            r.dk[ko + j * D + d] += scale * ds * q[qo + i * D + d];
            r.dv[ko + j * D + d] += p[j] * dout[qo + i * D + d];
          }
        }
      }
    }
  return r;
}

template <typename T>
double error(const std::vector<T>& got, const std::vector<double>& want) {
  double diff = 0, scale = 1.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = to_double(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    diff = std::max(diff, std::abs(g - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / scale;
}

int failures = 0;
void report(const char* what, const std::string& name, double err, double tol) {
  const bool ok = err <= tol;
  if (!ok) ++failures;
  printf("  %-5s %-40s err %.3g (tol %.1g) %s\n", what, name.c_str(), err, tol, ok ? "ok" : "FAIL");
}

template <typename T>
const char* dtype_name() {
  return std::is_same_v<T, __half> ? "f16" : "bf16";
}

template <typename T, typename LseT>
// flash: the tensor-core kernels (tiles128; v1 too where `v1`), else the general ones.
void run_case(const Problem& pr, bool flash, double tol, bool v1 = true) {
  std::mt19937 rng(pr.B * 1000 + pr.Sq * 7 + pr.Sk + pr.D);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  const size_t nq = static_cast<size_t>(pr.B) * pr.H * pr.Sq * pr.D;
  const size_t nk = static_cast<size_t>(pr.B) * pr.H * pr.Sk * pr.D;
  std::vector<T> q(nq), k(nk), v(nk), dout(nq);
  std::vector<double> qd(nq), kd(nk), vd(nk), dod(nq);
  for (size_t i = 0; i < nq; ++i) {
    q[i] = from_double<T>(normal(rng));
    qd[i] = to_double(q[i]);
  }
  for (size_t i = 0; i < nk; ++i) {
    k[i] = from_double<T>(normal(rng));
    kd[i] = to_double(k[i]);
  }
  for (size_t i = 0; i < nk; ++i) {
    v[i] = from_double<T>(normal(rng));
    vd[i] = to_double(v[i]);
  }
  for (size_t i = 0; i < nq; ++i) {
    dout[i] = from_double<T>(normal(rng));
    dod[i] = to_double(dout[i]);
  }
  std::vector<uint8_t> mask(static_cast<size_t>(pr.B) * pr.Sk, 0);
  for (int b = 0; b < pr.B; ++b)
    for (int j = 0; j < pr.Sk; ++j) {
      uint8_t& m = mask[static_cast<size_t>(b) * pr.Sk + j];
      if (pr.padding == 1) m = j > 0 && uniform(rng) < 0.35;
      if (pr.padding == 2) m = b == 0;
      if (pr.padding == 3) m = j == 0;
      if (pr.padding == 4) m = b == 0 ? j >= 64 && j < 128 : j >= 64;
      if (pr.padding == 5) m = j < 70;
    }
  const double scale = 1.0 / std::sqrt(static_cast<double>(pr.D));
  const Reference want = reference(pr, qd, kd, vd, dod, mask, scale);

  std::vector<T> out(nq);
  std::vector<LseT> lse(static_cast<size_t>(pr.B) * pr.H * pr.Sq);
  ForwardParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.key_padding_mask = pr.padding ? mask.data() : nullptr;
  p.out = out.data();
  p.lse = lse.data();
  p.batch = pr.B;
  p.heads = pr.H;
  p.q_len = pr.Sq;
  p.k_len = pr.Sk;
  p.head_dim = pr.D;
  p.scale = scale;
  p.causal = pr.causal;
  p.dtype = element_type<T>();

  std::vector<T> dq(nq), dk(nk), dv(nk);
  std::vector<LseT> row_dot(lse.size());
  std::vector<float> dq_accum(nq, 0.f);
  BackwardParams bp;
  bp.fwd = p;
  bp.grad_out = dout.data();
  bp.row_dot = row_dot.data();
  bp.grad_q_accum = dq_accum.data();
  bp.grad_q = dq.data();
  bp.grad_k = dk.data();
  bp.grad_v = dv.data();

  const std::string name = std::string(flash ? "flash " : "simple ") + "B" + std::to_string(pr.B) + " H" +
                           std::to_string(pr.H) + " Sq" + std::to_string(pr.Sq) + " Sk" + std::to_string(pr.Sk) + " D" +
                           std::to_string(pr.D) + (pr.causal ? " causal" : "") + " pad" + std::to_string(pr.padding) +
                           " " +
                           (sizeof(T) == 2   ? dtype_name<T>()
                            : sizeof(T) == 4 ? "f32"
                                             : "f64");
  unsigned char* smem = conveyor::attention::cuda::smem_raw;
  const size_t cap = sizeof(conveyor::attention::cuda::smem_raw);
  auto rows_grid = [&](int rows, int block) { return dim3((rows + block - 1) / block, pr.H, pr.B); };

  if (flash) {
    if constexpr (sizeof(T) == 2) {
      // Both forwards, as their launchers run them: v1, then tiles128, whose
      // out and lse the backward then reads.
      auto fwd = [&]<int kD>() {
        using C1 = FlashForwardConfigFor<T, kD>;
        if (v1) {
          emulated::launch(flash_forward_kernel<T, C1>, rows_grid(pr.Sq, C1::kBlockM), C1::kThreads,
                           forward_smem_bytes<C1>(pr.Sk), smem, cap, p);
          report("out v1", name, error(out, want.out), tol);
          report("lse v1", name, error(lse, want.lse), tol);
        }
        std::fill(out.begin(), out.end(), from_double<T>(NAN));
        std::fill(lse.begin(), lse.end(), static_cast<LseT>(NAN));
        using C = TilesForwardConfigFor<T, kD>;
        emulated::launch(flash_forward_tiles_kernel<T, C>, rows_grid(pr.Sq, C::kBlockM), C::kThreads,
                         forward_smem_bytes<C>(pr.Sk),
                         smem, cap, p);
      };
      if (pr.D == 64)
        fwd.template operator()<64>();
      else
        fwd.template operator()<128>();
    }
  } else {
    emulated::launch(simple_forward_kernel<T, LseT>, rows_grid(pr.Sq, SimpleTiles::kBlockM), SimpleTiles::kThreads,
                     SimpleTiles::forward_elements(pr.D) * sizeof(LseT), smem, cap, p);
  }
  report(flash ? "out tiles128" : "out", name, error(out, want.out), tol);
  report(flash ? "lse tiles128" : "lse", name, error(lse, want.lse), tol);

  // The backward runs on the kernel's own out and lse, as in real use.
  const int64_t rows = static_cast<int64_t>(pr.B) * pr.H * pr.Sq;
  emulated::launch(row_dot_kernel<T, LseT>, dim3((rows + SimpleTiles::kWarps - 1) / SimpleTiles::kWarps),
                   SimpleTiles::kThreads, 0, smem, cap, bp);
  if (flash) {
    if constexpr (sizeof(T) == 2) {
      // Both backwards, as their launchers run them: v1, then tiles128.
      auto bwd = [&]<typename C>(const char* kernel) {
        std::fill(dq_accum.begin(), dq_accum.end(), 0.f);
        std::fill(dk.begin(), dk.end(), from_double<T>(NAN));
        std::fill(dv.begin(), dv.end(), from_double<T>(NAN));
        emulated::launch(flash_backward_kernel<T, C>, rows_grid(pr.Sk, C::kBlockN), C::kThreads, C::kSmemBytes, smem,
                         cap, bp);
        for (size_t i = 0; i < nq; ++i) dq[i] = from_double<T>(dq_accum[i]);  // scaled by the kernel
        if (std::string(kernel) == "tiles128") return;  // reported below
        report("dq v1", name, error(dq, want.dq), tol);
        report("dk v1", name, error(dk, want.dk), tol);
        report("dv v1", name, error(dv, want.dv), tol);
      };
      if (pr.D == 64) {
        if (v1) bwd.template operator()<FlashBackwardConfigFor<T, 64>>("v1");
        bwd.template operator()<TilesBackwardConfigFor<T, 64>>("tiles128");
      } else {
        if (v1) bwd.template operator()<FlashBackwardConfigFor<T, 128>>("v1");
        bwd.template operator()<TilesBackwardConfigFor<T, 128>>("tiles128");
      }
    }
  } else {
    emulated::launch(simple_dkdv_kernel<T, LseT>, rows_grid(pr.Sk, SimpleTiles::kBlockN), SimpleTiles::kThreads,
                     SimpleTiles::dkdv_elements(pr.D) * sizeof(LseT), smem, cap, bp);
    emulated::launch(simple_dq_kernel<T, LseT>, rows_grid(pr.Sq, SimpleTiles::kBlockM), SimpleTiles::kThreads,
                     SimpleTiles::dq_elements(pr.D) * sizeof(LseT), smem, cap, bp);
  }
  report(flash ? "dq tiles128" : "dq", name, error(dq, want.dq), tol);
  report(flash ? "dk tiles128" : "dk", name, error(dk, want.dk), tol);
  report(flash ? "dv tiles128" : "dv", name, error(dv, want.dv), tol);
  fflush(stdout);
}

// The binding sends a call to the tensor-core kernels only when their 16-byte
// copies are aligned (flash_takes): a view that starts 2 bytes into its
// storage goes to the general kernels, which the cases below also check.
void check_alignment_rule() {
  alignas(16) static unsigned char bytes[64];
  ForwardParams p;
  p.dtype = ElementType::kHalf, p.head_dim = 64;
  p.q = p.k = p.v = bytes, p.out = bytes;
  BackwardParams bp;
  bp.fwd = p, bp.grad_out = bytes, bp.grad_k = bytes, bp.grad_v = bytes;
  const bool aligned = flash_takes(p) && flash_takes(bp);
  ForwardParams shifted = p;
  shifted.k = bytes + 2;  // k = kv[1:] of a half tensor, say
  BackwardParams shifted_grad = bp;
  shifted_grad.grad_out = bytes + 8;
  ForwardParams wrong_dim = p;
  wrong_dim.head_dim = 72;
  const bool ok = aligned && !flash_takes(shifted) && !flash_takes(shifted_grad) && !flash_takes(wrong_dim);
  if (!ok) ++failures;
  printf("  alignment rule: aligned -> tensor cores, misaligned k or grad_out or head_dim 72 -> general %s\n",
         ok ? "ok" : "FAILED");
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  check_alignment_rule();
  const std::vector<Problem> flash_cases = {
      {1, 1, 70, 130, 64, false, 1}, {2, 1, 100, 37, 128, true, 3}, {1, 2, 1, 1, 64, false, 0},
      {2, 1, 65, 65, 64, true, 2},   {1, 1, 130, 70, 128, true, 1}, {1, 1, 64, 200, 128, false, 0},
      {1, 1, 40, 200, 64, true, 1},  // key blocks past the last query
      {2, 1, 70, 200, 64, false, 4}, {1, 1, 100, 150, 128, true, 5},  // key blocks the mask hides: skipped
      {1, 1, 160, 96, 128, true, 0},  // tiles128's unmasked path: whole query blocks below the diagonal
  };
  // Every case in float16 with both kernels; bfloat16 (other conversions,
  // the same tiling) with tiles128 on the first four. Each emulated thread is
  // an OS thread, and every kernel runs twice (tiles128 and v1).
  if (only.empty() || only == "flash") {
    for (size_t i = 0; i < flash_cases.size(); ++i) {
      run_case<__half, float>(flash_cases[i], true, 6e-3);
      if (i < 4) run_case<__nv_bfloat16, float>(flash_cases[i], true, 3e-2, /*v1=*/false);
    }
  }
  // The largest shapes of the GPU test (FusedAttentionCuda), one head each:
  // the errors they show here are what its tolerances rest on. Only when
  // asked: they take twice as long as everything else together.
  if (only == "large") {
    const std::vector<Problem> large_cases = {{1, 1, 300, 300, 64, true, 1}, {1, 1, 257, 513, 128, false, 1}};
    for (const Problem& pr : large_cases) {
      run_case<__half, float>(pr, true, 6e-3);
      run_case<__nv_bfloat16, float>(pr, true, 3e-2);
    }
    run_case<float, float>({1, 1, 100, 100, 200, true, 0}, false, 2e-5);
  }
  if (only.empty() || only == "simple") {
    const std::vector<Problem> simple_cases = {
        {1, 1, 40, 70, 40, true, 1}, {2, 1, 17, 33, 24, false, 2}, {1, 2, 1, 1, 8, false, 0},
        {1, 1, 35, 20, 72, true, 3}, {1, 1, 10, 90, 16, true, 1},
    };
    for (const Problem& pr : simple_cases) {
      run_case<float, float>(pr, false, 2e-5);
      run_case<double, double>(pr, false, 1e-12);
      run_case<__half, float>(pr, false, 6e-3);
      run_case<__nv_bfloat16, float>(pr, false, 3e-2);
    }
  }
  printf("%s: %d failures, %ld warp collectives\n", failures ? "FAILED" : "PASSED", failures,
         emulated::collective_count.load());
  return failures ? 1 : 0;
}
