#pragma once
// The float64 LSTM layer that check_kernels.cpp holds the CUDA kernels to,
// written from torch::nn::LSTM's equations (gate order i, f, g, o), forward
// and backward through time, with the random inputs of a problem and the
// conversions between float64 and the kernels' dtypes.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

namespace emulated_lstm {

struct Problem {
  int T, B, H, sms;  // sms: the emulated device's multiprocessors (the persistent kernels' plan)
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

inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

inline Result reference(const Problem& p, const Inputs& in) {
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
  std::vector<T> out;
  out.reserve(v.size());
  for (double x : v) out.push_back(static_cast<T>(static_cast<std::conditional_t<sizeof(T) == 2, float, T>>(x)));
  return out;
}
template <typename T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out;
  out.reserve(v.size());
  for (const T& x : v) out.push_back(static_cast<double>(static_cast<std::conditional_t<sizeof(T) == 2, float, T>>(x)));
  return out;
}
// The inputs a kernel of parameter dtype scalar_t sees: those it reads in
// scalar_t rounded through it (the float64 reference then starts from the same values).
template <typename scalar_t>
Inputs as_seen_by(Inputs in) {
  for (auto* v : {&in.xproj, &in.w_hh, &in.h0, &in.dh_seq}) *v = widen(cast<scalar_t>(*v));
  return in;
}

// max |got - want| / (1 + max |want|)
inline double error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::isfinite(got[i]) ? std::abs(got[i] - want[i]) : INFINITY);
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / (1 + scale);
}

inline Inputs make_inputs(const Problem& p, unsigned seed) {
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

inline unsigned seed_of(const Problem& p) { return 1000u * p.H + 10u * p.B + p.T; }

}  // namespace emulated_lstm
