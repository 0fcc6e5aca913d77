// Runs the fused LSTM's CUDA kernels on the host emulation
// (ops/cuda/host_emulation) and compares them with a float64 reference LSTM
// written from torch::nn::LSTM's equations (gate order i, f, g, o) and with
// each other:
//   - the persistent kernels, forward and backward, with each product
//     (lstm_block_product.cuh): scalar in float64 and float32, TF32, and
//     float16 / bfloat16 tensor cores;
//   - the first persistent forward ("v1") and the per-step kernels;
//   - the block product alone, on integers, which every product must give
//     exactly (the fragment layouts, padding and chunking, with no rounding
//     to hide behind);
// on hidden sizes 40 to 265 over emulated devices of 6 to 16 multiprocessors
// (several units a block, a partial last block, A rows short of a tile),
// batches 1 to 33, shared-memory limits that split the product into passes,
// and sequences up to 200 steps. Exit status 0 when every comparison is
// within its tolerance; prints each error.
//
// The per-step kernels' tiles are static __shared__ arrays: one block runs at
// a time under launch(), so one static array a kernel is that block's shared
// memory. The persistent kernels' blocks run at once (launch_cooperative()),
// each with its own dynamic shared memory.
#undef __shared__
#define __shared__ static
#define CONVEYOR_DYNAMIC_SHARED_MEMORY(name) unsigned char* name = ::emulated::block_shared()
#define CONVEYOR_EMULATED_WARP_SUM

namespace conveyor::lstm::cuda {
// One collective for the five shuffles of the kernels' butterfly; each lane
// adds the same pairs in the same order as the shuffles would.
template <typename acc_t>
acc_t warp_sum(acc_t v) {
  auto& w = emulated::my_warp();
  const int lane = emulated::my_lane();
  w.shfl[lane] = static_cast<double>(v);
  w.bar.arrive_and_wait();
  acc_t vals[32];
  for (int l = 0; l < 32; ++l) vals[l] = static_cast<acc_t>(w.shfl[l]);
  w.bar.arrive_and_wait();
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc_t next[32];
    for (int l = 0; l < 32; ++l) next[l] = vals[l] + vals[l ^ offset];
    for (int l = 0; l < 32; ++l) vals[l] = next[l];
  }
  emulated::collective_count++;
  return vals[lane];
}
}  // namespace conveyor::lstm::cuda

#include "ops/fused_lstm/cuda/lstm_persistent_kernel.cuh"
#include "ops/fused_lstm/cuda/lstm_persistent_warp_kernel.cuh"
#include "ops/fused_lstm/cuda/lstm_step_kernels.cuh"
#include "ops/fused_lstm/cuda/host_emulation/reference_lstm.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using namespace conveyor::lstm::cuda;
using namespace emulated_lstm;

namespace {

int failures = 0;

void report(const char* what, const std::string& name, double err, double tol) {
  const bool ok = err <= tol;
  if (!ok) ++failures;
  printf("  %-26s %-52s err %.3g (tol %.3g) %s\n", what, name.c_str(), err, tol, ok ? "ok" : "FAILED");
}

template <typename scalar_t>
const char* dtype_name() {
  if constexpr (std::is_same_v<scalar_t, double>) return "f64";
  if constexpr (std::is_same_v<scalar_t, float>) return "f32";
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) return "bf16";
  return "f16";
}
const char* math_name(Math math) { return math == Math::kMma16 ? "mma16" : math == Math::kTf32 ? "tf32" : "fma"; }

std::string problem_name(const char* dtype, const Problem& p) {
  return std::string(dtype) + " T" + std::to_string(p.T) + " B" + std::to_string(p.B) + " H" + std::to_string(p.H);
}

// A forward's inputs in the kernels' dtypes and its outputs, starting as NaN.
template <typename scalar_t>
struct Forward {
  using acc_t = AccOf<scalar_t>;
  Forward(const Problem& p, const Inputs& in)
      : bh(static_cast<size_t>(p.B) * p.H),
        xproj(cast<scalar_t>(in.xproj)),
        w(cast<scalar_t>(in.w_hh)),
        h0(cast<scalar_t>(in.h0)),
        bias(cast<acc_t>(in.bias)),
        c0(cast<acc_t>(in.c0)),
        hs(p.T * bh, static_cast<scalar_t>(NAN)),
        cells(p.T * bh, NAN),
        gates(4 * p.T * bh, NAN) {}
  ForwardSequence<scalar_t> sequence(const Problem& p) {
    ForwardSequence<scalar_t> s;
    s.xproj = xproj.data(), s.bias = bias.data(), s.w_hh = w.data(), s.h0 = h0.data(), s.c0 = c0.data();
    s.hs = hs.data(), s.cells = cells.data(), s.gates = gates.data();
    s.seq_len = p.T, s.batch = p.B, s.hidden = p.H;
    return s;
  }
  size_t bh;
  std::vector<scalar_t> xproj, w, h0;
  std::vector<acc_t> bias, c0;
  std::vector<scalar_t> hs;
  std::vector<acc_t> cells, gates;
};

template <typename scalar_t>
Result forward_result(const Forward<scalar_t>& f) {
  Result r;
  r.hs = widen(f.hs), r.cells = widen(f.cells), r.gates = widen(f.gates);
  return r;
}

// A shared-memory limit under which `l`'s operand V (the shared vector) takes
// about `passes` passes instead of one.
size_t limit_for_passes(const block::Layout& l, int passes) {
  const size_t v_bytes = l.p_offset - l.v_offset;
  return l.bytes - v_bytes + v_bytes / passes + 64;
}

// The persistent forward and backward with product `math`, laid out as the
// launcher would on `p.sms` multiprocessors with `limit` bytes of shared
// memory a block; the backward runs over the forward's own gates and cells,
// as the driver runs them (fused_lstm_cuda.cu).
template <typename scalar_t, Math math>
Result run_persistent(const Problem& p, const Inputs& in, int passes, std::string* layout) {
  using acc_t = AccOf<scalar_t>;
  Forward<scalar_t> f(p, in);
  // The limit that splits the backward's product into `passes` passes.
  const size_t limit = limit_for_passes(persistent::plan<scalar_t, math>(p.H, p.B, p.sms, 227 * 1024, true).layout, passes);
  const persistent::Plan fp = persistent::plan<scalar_t, math>(p.H, p.B, p.sms, limit, false);
  const persistent::Plan bp = persistent::plan<scalar_t, math>(p.H, p.B, p.sms, limit, true);
  if (fp.layout.bytes == 0 || bp.layout.bytes == 0 || fp.blocks > p.sms || bp.blocks > p.sms) {
    fprintf(stderr, "the persistent plan does not fit %s\n", problem_name(dtype_name<scalar_t>(), p).c_str());
    ++failures;
    return {};
  }
  auto passes_of = [](const block::Layout& l) { return (l.k_pad + l.chunk - 1) / l.chunk; };
  *layout = std::to_string(p.sms) + " SMs, fwd " + std::to_string(fp.blocks) + "x" +
            std::to_string(fp.units_per_block) + "u/" + std::to_string(passes_of(fp.layout)) + "p, bwd " +
            std::to_string(bp.blocks) + "x" + std::to_string(bp.units_per_block) + "u/" +
            std::to_string(passes_of(bp.layout)) + "p";
  emulated::launch_cooperative(persistent::lstm_forward_persistent_kernel<scalar_t, math>, dim3(fp.blocks),
                               dim3(persistent::kThreads), fp.layout.bytes, f.sequence(p), fp.units_per_block,
                               fp.layout);
  Result r = forward_result(f);
  std::vector<scalar_t> dh_seq = cast<scalar_t>(in.dh_seq);
  std::vector<acc_t> dh_last = cast<acc_t>(in.dh_last), dc = cast<acc_t>(in.dc_last);
  std::vector<acc_t> dgates(4 * p.T * f.bh, NAN);
  BackwardSequence<scalar_t> b;
  b.w_hh = f.w.data(), b.dh_seq = dh_seq.data(), b.dh_last = dh_last.data(), b.gates = f.gates.data();
  b.cells = f.cells.data(), b.c0 = f.c0.data(), b.dc = dc.data(), b.dgates = dgates.data();
  b.seq_len = p.T, b.batch = p.B, b.hidden = p.H;
  emulated::launch_cooperative(persistent::lstm_backward_persistent_kernel<scalar_t, math>, dim3(bp.blocks),
                               dim3(persistent::kThreads), bp.layout.bytes, b, bp.units_per_block, bp.layout);
  r.dgates = widen(dgates), r.dc0 = widen(dc);
  return r;
}

// The first persistent forward ("v1").
template <typename scalar_t>
Result persistent_warp_forward(const Problem& p, const Inputs& in) {
  Forward<scalar_t> f(p, in);
  const persistent_warp::Plan plan = persistent_warp::plan<scalar_t>(p.H, p.B, p.sms);
  emulated::launch_cooperative(persistent_warp::lstm_forward_persistent_kernel<scalar_t>, dim3(plan.blocks),
                               dim3(persistent_warp::kThreads), plan.shared_bytes, f.sequence(p),
                               plan.units_per_block);
  return forward_result(f);
}

// The per-step forward, then the per-step backward over its saved gates and
// cells, as the driver runs them (fused_lstm_cuda.cu).
template <typename scalar_t>
Result per_step(const Problem& p, const Inputs& in) {
  using acc_t = AccOf<scalar_t>;
  Forward<scalar_t> f(p, in);
  const size_t bh = f.bh;
  auto &xproj = f.xproj, &w = f.w, &h0 = f.h0, &hs = f.hs;
  auto &bias = f.bias, &c0 = f.c0, &cells = f.cells, &gates = f.gates;
  const dim3 grid = step::step_grid(p.B, p.H), block(step::kTileUnits, step::kTileBatch);
  for (int t = 0; t < p.T; ++t) {
    ForwardStep<scalar_t> s;
    s.xproj_t = xproj.data() + t * 4 * bh, s.bias = bias.data(), s.w_hh = w.data();
    s.h_prev = t == 0 ? h0.data() : hs.data() + (t - 1) * bh;
    s.c_prev = t == 0 ? c0.data() : cells.data() + (t - 1) * bh;
    s.h_out = hs.data() + t * bh, s.c_out = cells.data() + t * bh, s.gates_out = gates.data() + 4 * t * bh;
    s.batch = p.B, s.hidden = p.H;
    emulated::launch(step::lstm_forward_step_kernel<scalar_t>, grid, block, 0, nullptr, 0, s);
  }
  std::vector<scalar_t> dh_seq = cast<scalar_t>(in.dh_seq);
  std::vector<acc_t> dh_last = cast<acc_t>(in.dh_last), dc = cast<acc_t>(in.dc_last), dgates(4 * p.T * bh, NAN);
  for (int t = p.T - 1; t >= 0; --t) {
    BackwardStep<scalar_t> s;
    s.dgates_next = t + 1 < p.T ? dgates.data() + 4 * (t + 1) * bh : nullptr;
    s.w_hh = w.data(), s.dh_out_t = dh_seq.data() + t * bh, s.dh_last = dh_last.data();
    s.gates_t = gates.data() + 4 * t * bh, s.c_t = cells.data() + t * bh;
    s.c_prev = t == 0 ? c0.data() : cells.data() + (t - 1) * bh;
    s.dc = dc.data(), s.dgates_t = dgates.data() + 4 * t * bh;
    s.batch = p.B, s.hidden = p.H;
    emulated::launch(step::lstm_backward_step_kernel<scalar_t>, grid, block, 0, nullptr, 0, s);
  }
  Result r = forward_result(f);
  r.dgates = widen(dgates), r.dc0 = widen(dc);
  return r;
}


void report_all(const char* kind, const std::string& name, const Result& got, const Result& want, double tol) {
  const std::string k = kind;
  report((k + " hs").c_str(), name, error(got.hs, want.hs), tol);
  report((k + " cells").c_str(), name, error(got.cells, want.cells), tol);
  report((k + " gates").c_str(), name, error(got.gates, want.gates), tol);
  if (!want.dgates.empty() && !got.dgates.empty()) {
    report((k + " dgates").c_str(), name, error(got.dgates, want.dgates), tol);
    report((k + " dc0").c_str(), name, error(got.dc0, want.dc0), tol);
  }
  fflush(stdout);
}

// The persistent kernels with product `math` in dtype scalar_t against the
// float64 reference from the same (rounded) inputs.
template <typename scalar_t, Math math>
void check_persistent(const Problem& p, int passes, double tol) {
  const Inputs in = as_seen_by<scalar_t>(make_inputs(p, seed_of(p)));
  const Result want = reference(p, in);
  std::string layout;
  const Result got = run_persistent<scalar_t, math>(p, in, passes, &layout);
  if (got.hs.empty()) return;
  const std::string kind = std::string("persistent ") + math_name(math);
  report_all(kind.c_str(), problem_name(dtype_name<scalar_t>(), p) + ", " + layout, got, want, tol);
}

// The first persistent forward and the per-step kernels.
template <typename scalar_t>
void check_first_kernels(const Problem& p, double tol) {
  const Inputs in = make_inputs(p, seed_of(p));
  const Result want = reference(p, in);
  const std::string name = problem_name(dtype_name<scalar_t>(), p);
  report_all("per-step", name, per_step<scalar_t>(p, in), want, tol);
  if (p.B > persistent_warp::kMaxBatch) return;  // the launcher sends these to the per-step kernel
  report_all("v1 persistent", name + " on " + std::to_string(p.sms) + " SMs", persistent_warp_forward<scalar_t>(p, in),
             want, tol);
}

// One block's product on integers: every product must give it exactly.
template <typename scalar_t, Math math>
struct ProductCheck {
  using acc_t = AccOf<scalar_t>;
  static void kernel(block::Layout l, const double* a, const double* v, double* out) {
    unsigned char* smem = emulated::block_shared();
    block::load_a<scalar_t, math>(l, smem, (l.rows & 1) != 0,
                                  [&](int row, int k) { return static_cast<scalar_t>(a[row * l.k + k]); });
    block::multiply<scalar_t, math>(l, smem, [&](int n, int k) { return static_cast<acc_t>(v[n * l.k + k]); });
    for (int e = threadIdx.x; e < l.rows * l.batch; e += blockDim.x) {
      out[e] = static_cast<double>(block::product<acc_t>(l, smem, e / l.batch, e % l.batch));
    }
  }
  static void run(int rows, int k, int batch, int passes) {
    const size_t limit = limit_for_passes(block::layout<scalar_t, math>(rows, k, batch, 0, size_t(1) << 30), passes);
    std::mt19937 rng(rows * 1000 + k * 10 + batch);
    std::uniform_int_distribution<int> d(-4, 4);
    std::vector<double> a(static_cast<size_t>(rows) * k), v(static_cast<size_t>(batch) * k);
    for (double& x : a) x = d(rng);
    for (double& x : v) x = d(rng);
    std::vector<double> want(static_cast<size_t>(rows) * batch, 0), got(want.size(), NAN);
    for (int r = 0; r < rows; ++r)
      for (int n = 0; n < batch; ++n)
        for (int i = 0; i < k; ++i) want[r * batch + n] += a[r * k + i] * v[n * k + i];
    const block::Layout l = block::layout<scalar_t, math>(rows, k, batch, 0, limit);
    if (l.bytes == 0) {
      fprintf(stderr, "block product %dx%dx%d does not fit %zu bytes\n", rows, k, batch, limit);
      ++failures;
      return;
    }
    emulated::launch_cooperative(kernel, dim3(1), dim3(block::kThreads), l.bytes, l, a.data(), v.data(), got.data());
    double diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::isnan(got[i]) ? INFINITY : std::abs(got[i] - want[i]));
    const std::string name = std::string(dtype_name<scalar_t>()) + " " + std::to_string(rows) + " rows x k " +
                             std::to_string(k) + " x batch " + std::to_string(batch) + ", " +
                             std::to_string((l.k_pad + l.chunk - 1) / l.chunk) + " passes, " +
                             std::to_string(l.k_splits) + " k-splits";
    report((std::string("product ") + math_name(math)).c_str(), name, diff, 0);
  }
};

template <typename scalar_t, Math math>
void check_products() {
  // rows short of a tile, a tile, past one; k past a K tile; batches short of
  // and past an N tile; limits of one pass and of several.
  const int shapes[][3] = {{3, 40, 1}, {16, 133, 8}, {20, 265, 5}, {37, 1030, 13}};
  for (const auto& s : shapes) {
    ProductCheck<scalar_t, math>::run(s[0], s[1], s[2], 1);
    ProductCheck<scalar_t, math>::run(s[0], s[1], s[2], 2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  auto wants = [&](const char* what) { return only.empty() || only == what; };
  // The block product alone, exactly.
  if (wants("product")) {
    check_products<double, Math::kFma>();
    check_products<float, Math::kFma>();
    check_products<float, Math::kTf32>();
    check_products<c10::BFloat16, Math::kMma16>();
    check_products<c10::Half, Math::kMma16>();
  }
  // The persistent kernels. Hidden sizes above the SM count put several units
  // in a block, with a partial last block; a 12 KiB limit splits the product
  // into passes. Tolerances: float64 and float32 products as the reference's
  // own rounding; TF32 and 16-bit operands round each product's inputs (2^-11,
  // 2^-8 or 2^-11 relative), and the 16-bit kernels keep h_t in their dtype.
  if (wants("persistent")) {
    check_persistent<double, Math::kFma>({16, 1, 133, 6}, 1, 1e-12);
    check_persistent<double, Math::kFma>({3, 5, 133, 8}, 3, 1e-12);
    check_persistent<float, Math::kFma>({3, 9, 40, 16}, 1, 1e-6);
    check_persistent<float, Math::kTf32>({16, 1, 133, 6}, 1, 5e-4);
    check_persistent<float, Math::kTf32>({3, 9, 133, 8}, 3, 5e-4);
    check_persistent<c10::BFloat16, Math::kMma16>({16, 1, 133, 6}, 1, 5e-3);
    check_persistent<c10::BFloat16, Math::kMma16>({3, 9, 133, 8}, 3, 5e-3);
    check_persistent<c10::Half, Math::kMma16>({4, 17, 40, 16}, 1, 5e-4);
    check_persistent<c10::BFloat16, Math::kFma>({4, 8, 40, 16}, 1, 5e-3);
  }
  // The first persistent forward and the per-step kernels. B = 33 is past
  // the first persistent kernel's batch limit; the 200-step sequence carries
  // errors through time.
  if (wants("v1")) {
    check_first_kernels<float>({200, 1, 40, 6}, 1e-6);
    check_first_kernels<double>({3, 8, 40, 16}, 1e-12);
    check_first_kernels<float>({2, 33, 133, 16}, 1e-6);
    check_first_kernels<double>({2, 1, 265, 8}, 1e-12);
  }
  printf("%s: %d failures, %ld warp collectives\n", failures ? "FAILED" : "PASSED", failures,
         emulated::collective_count.load());
  return failures ? 1 : 0;
}
