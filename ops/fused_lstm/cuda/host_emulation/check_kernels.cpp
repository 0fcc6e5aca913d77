// Runs the fused LSTM's CUDA kernels (the persistent forward, the per-step
// forward and backward) on the host emulation (ops/cuda/host_emulation) and
// compares them with a float64 reference LSTM written from torch::nn::LSTM's
// equations (gate order i, f, g, o) and with each other: hidden sizes 40,
// 133 and 265 on emulated devices of 8 and 16 multiprocessors (several units
// per block, a partial last block), batches 1, 8 and 33 (past the persistent
// kernel's limit), float32 and float64, sequences up to 200 steps. Exit
// status 0 when every comparison is within its tolerance; prints each error.
//
// The per-step kernels' tiles are static __shared__ arrays: one block runs at
// a time under launch(), so one static array a kernel is that block's shared
// memory. The persistent kernel's blocks run at once (launch_cooperative()),
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
#include "ops/fused_lstm/cuda/lstm_step_kernels.cuh"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

using namespace conveyor::lstm::cuda;

namespace {

int failures = 0;

struct Problem {
  int T, B, H, sms;  // sms: the emulated device's multiprocessors (the persistent kernel's plan)
  const char* dtypes = "f32 f64";  // the long sequences run in one each
};

// A layer's inputs, in float64.
struct Inputs {
  std::vector<double> xproj, bias, w_hh, h0, c0, dh_seq, dh_last, dc_last;
};

// Outputs in float64: forward (hs, cells, gates) and backward (dgates of
// every step, dc0).
struct Result {
  std::vector<double> hs, cells, gates, dgates, dc0;
};

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

Result reference(const Problem& p, const Inputs& in) {
  const int T = p.T, B = p.B, H = p.H;
  Result r;
  r.hs.assign(static_cast<size_t>(T) * B * H, 0);
  r.cells = r.hs;
  r.gates.assign(static_cast<size_t>(T) * B * 4 * H, 0);
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < H; ++j) {
        double pre[4];
        for (int g = 0; g < 4; ++g) {
          double s = in.xproj[(static_cast<size_t>(t) * B + b) * 4 * H + g * H + j] + in.bias[g * H + j];
          for (int k = 0; k < H; ++k) {
            const double h = t == 0 ? in.h0[b * H + k] : r.hs[(static_cast<size_t>(t - 1) * B + b) * H + k];
            s += in.w_hh[(static_cast<size_t>(g) * H + j) * H + k] * h;
          }
          pre[g] = s;
        }
        const double i = sigmoid(pre[0]), f = sigmoid(pre[1]), gg = std::tanh(pre[2]), o = sigmoid(pre[3]);
        const size_t bj = static_cast<size_t>(b) * H + j, at = static_cast<size_t>(t) * B * H + bj;
        const double c_prev = t == 0 ? in.c0[bj] : r.cells[at - static_cast<size_t>(B) * H];
        r.cells[at] = f * c_prev + i * gg;
        r.hs[at] = o * std::tanh(r.cells[at]);
        const size_t gr = (static_cast<size_t>(t) * B + b) * 4 * H + j;
        r.gates[gr] = i, r.gates[gr + H] = f, r.gates[gr + 2 * H] = gg, r.gates[gr + 3 * H] = o;
      }
  // Backward through time from dh_seq, dh_last (gradient of h_n) and dc_last.
  r.dgates.assign(r.gates.size(), 0);
  std::vector<double> dc = in.dc_last;
  for (int t = T - 1; t >= 0; --t)
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < H; ++j) {
        const size_t bj = static_cast<size_t>(b) * H + j, at = static_cast<size_t>(t) * B * H + bj;
        double dh = in.dh_seq[at];
        if (t == T - 1) {
          dh += in.dh_last[bj];
        } else {
          for (int k = 0; k < 4 * H; ++k) {
            dh += r.dgates[(static_cast<size_t>(t + 1) * B + b) * 4 * H + k] * in.w_hh[static_cast<size_t>(k) * H + j];
          }
        }
        const size_t gr = (static_cast<size_t>(t) * B + b) * 4 * H + j;
        const double i = r.gates[gr], f = r.gates[gr + H], gg = r.gates[gr + 2 * H], o = r.gates[gr + 3 * H];
        const double tc = std::tanh(r.cells[at]);
        const double c_prev = t == 0 ? in.c0[bj] : r.cells[at - static_cast<size_t>(B) * H];
        const double d = dc[bj] + dh * o * (1 - tc * tc);
        r.dgates[gr] = d * gg * i * (1 - i);
        r.dgates[gr + H] = d * c_prev * f * (1 - f);
        r.dgates[gr + 2 * H] = d * i * (1 - gg * gg);
        r.dgates[gr + 3 * H] = dh * tc * o * (1 - o);
        dc[bj] = d * f;
      }
  r.dc0 = dc;
  return r;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <typename T>
std::vector<double> widen(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// max |got - want| / (1 + max |want|)
double error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : INFINITY);
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / (1 + scale);
}

void report(const char* what, const std::string& name, double err, double tol) {
  const bool ok = err <= tol;
  if (!ok) ++failures;
  printf("  %-22s %-40s err %.3g (tol %.3g) %s\n", what, name.c_str(), err, tol, ok ? "ok" : "FAILED");
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
        hs(p.T * bh, NAN),
        cells(p.T * bh, NAN),
        gates(4 * p.T * bh, NAN) {}
  size_t bh;
  std::vector<scalar_t> xproj, w, h0;
  std::vector<acc_t> bias, c0;
  std::vector<scalar_t> hs;
  std::vector<acc_t> cells, gates;
};

// The persistent forward, laid out as the launcher would on `p.sms` multiprocessors.
template <typename scalar_t>
Result persistent_forward(const Problem& p, const Inputs& in) {
  Forward<scalar_t> f(p, in);
  ForwardSequence<scalar_t> s;
  s.xproj = f.xproj.data(), s.bias = f.bias.data(), s.w_hh = f.w.data(), s.h0 = f.h0.data(), s.c0 = f.c0.data();
  s.hs = f.hs.data(), s.cells = f.cells.data(), s.gates = f.gates.data();
  s.seq_len = p.T, s.batch = p.B, s.hidden = p.H;
  const persistent::Plan plan = persistent::plan<scalar_t>(p.H, p.B, p.sms);
  emulated::launch_cooperative(persistent::lstm_forward_persistent_kernel<scalar_t>, dim3(plan.blocks),
                               dim3(persistent::kThreads), plan.shared_bytes, s, plan.units_per_block);
  Result r;
  r.hs = widen(f.hs), r.cells = widen(f.cells), r.gates = widen(f.gates);
  return r;
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
  Result r;
  r.hs = widen(hs), r.cells = widen(cells), r.gates = widen(gates), r.dgates = widen(dgates), r.dc0 = widen(dc);
  return r;
}

Inputs make_inputs(const Problem& p, unsigned seed) {
  std::mt19937_64 rng(seed);
  const double bound = 1 / std::sqrt(static_cast<double>(p.H));
  auto fill = [&](size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(n);
    for (double& x : v) x = u(rng);
    return v;
  };
  const size_t bh = static_cast<size_t>(p.B) * p.H;
  Inputs in;
  in.xproj = fill(4 * p.T * bh, -1, 1);
  in.bias = fill(4 * p.H, -bound, bound);
  in.w_hh = fill(4 * static_cast<size_t>(p.H) * p.H, -bound, bound);
  in.h0 = fill(bh, -0.5, 0.5);
  in.c0 = fill(bh, -0.5, 0.5);
  in.dh_seq = fill(p.T * bh, -1, 1);
  in.dh_last = fill(bh, -1, 1);
  in.dc_last = fill(bh, -1, 1);
  return in;
}

template <typename scalar_t>
void run_case(const Problem& p, double tol) {
  const Inputs in = make_inputs(p, 1000u * p.H + 10u * p.B + p.T);
  const Result want = reference(p, in);
  const persistent::Plan plan = persistent::plan<scalar_t>(p.H, p.B, p.sms);
  const int last_units = p.H - (plan.blocks - 1) * plan.units_per_block;
  const std::string name = std::string(sizeof(scalar_t) == 8 ? "f64" : "f32") + " T" + std::to_string(p.T) + " B" +
                           std::to_string(p.B) + " H" + std::to_string(p.H);
  const Result stepped = per_step<scalar_t>(p, in);
  report("per-step hs", name, error(stepped.hs, want.hs), tol);
  report("per-step cells", name, error(stepped.cells, want.cells), tol);
  report("per-step gates", name, error(stepped.gates, want.gates), tol);
  report("per-step dgates", name, error(stepped.dgates, want.dgates), tol);
  report("per-step dc0", name, error(stepped.dc0, want.dc0), tol);
  if (p.B > persistent::kMaxBatch) return;  // the launcher sends these to the per-step kernel
  const std::string layout = name + " on " + std::to_string(p.sms) + " SMs: " + std::to_string(plan.blocks) + "x" +
                             std::to_string(plan.units_per_block) + " units, last " + std::to_string(last_units);
  const Result persisted = persistent_forward<scalar_t>(p, in);
  report("persistent hs", layout, error(persisted.hs, want.hs), tol);
  report("persistent cells", layout, error(persisted.cells, want.cells), tol);
  report("persistent gates", layout, error(persisted.gates, want.gates), tol);
  report("persistent=per-step hs", name, error(persisted.hs, stepped.hs), tol);
  fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  // T, B, H, emulated SMs. Hidden sizes above the SM count put several units
  // in a block, with a partial last block; B = 33 is past the persistent
  // kernel's batch limit; the 200-step sequences carry errors through time.
  // Each emulated CUDA thread is an OS thread and the persistent kernel's
  // grid sync wakes them all, so the long sequences run on few SMs.
  const std::vector<Problem> cases = {
      {200, 1, 40, 6, "f32"}, {3, 8, 40, 16}, {2, 33, 40, 16}, {4, 8, 133, 16}, {2, 1, 133, 8},
      {60, 1, 133, 6, "f64"}, {2, 8, 265, 16}, {2, 33, 265, 8}, {3, 1, 265, 8},
  };
  for (const Problem& p : cases) {
    const std::string dtypes = p.dtypes;
    if ((only.empty() || only == "f64") && dtypes.find("f64") != std::string::npos) run_case<double>(p, 1e-12);
    if ((only.empty() || only == "f32") && dtypes.find("f32") != std::string::npos) run_case<float>(p, 1e-6);
  }
  printf("%s: %d failures, %ld warp collectives\n", failures ? "FAILED" : "PASSED", failures,
         emulated::collective_count.load());
  return failures ? 1 : 0;
}
