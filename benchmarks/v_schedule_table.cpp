// The V schedules and the synthesiser, simulated: bubble and peak memory per
// worker against 1F1B and ZB-H1 on the same model, and synthesised schedules
// at three memory caps, and v-half and v-min at every K up to 8. Each of 2K model chunks costs F = I = W = 1 (a whole
// 1F1B stage is two chunks: 2, 2, 2); memory is counted in chunk activations
// (one micro-batch's on one chunk; a 1F1B stage's is 2). No LibTorch.
//
//   build/benchmarks/v_schedule_table
#include "schedules/generators.h"
#include "schedules/simulate.h"
#include "schedules/synthesise.h"
#include "schedules/v_shape.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

using namespace conveyor::schedules;

namespace {

SynthesisProblem problem(int k, int chunks, int m, double unit) {
  SynthesisProblem p;
  p.workers = k;
  p.chunks = chunks;
  p.microbatches = m;
  for (auto* v : {&p.forward, &p.input, &p.weight}) v->assign(k * chunks, unit);
  p.activation.assign(k * chunks, unit);  // a whole stage keeps two chunks' activations
  return p;
}

void row(const char* name, const Schedule& s, const SynthesisProblem& p, double one_f_one_b) {
  const Simulation sim = simulate(s, synthesis_costs(p));
  const auto peaks = peak_worker_memory(s, p.activation);
  std::printf("| %s | %.1f%% | %.3f | %.0f |\n", name, 100 * sim.bubble_fraction, sim.makespan / one_f_one_b,
              *std::max_element(peaks.begin(), peaks.end()));
}

}  // namespace

int main() {
  for (int k : {2, 4, 6, 8}) {
    for (int m : {16, 32}) {
      const SynthesisProblem straight = problem(k, 1, m, 2), v = problem(k, 2, m, 1);
      const double base = simulate(make_1f1b(k, m), synthesis_costs(straight)).makespan;
      std::printf("\nK = %d workers, M = %d\n\n| schedule | bubble | step / 1F1B's | peak memory (chunk activations) |\n"
                  "|---|---|---|---|\n", k, m);
      row("1f1b", make_1f1b(k, m), straight, base);
      row("zb-h1", make_zb_h1(k, m), straight, base);
      for (const char* name : {"zb-v", "v-half", "v-min", "dualpipev"}) {
        if (std::string(name) == "dualpipev" && m < 2 * k) continue;
        row(name, make_schedule(name, k, m), v, base);
      }
      for (double share : {1.0, 0.5, 1.0 / 3}) {
        SynthesisProblem capped = v;
        capped.memory_cap = std::max(2.0, std::ceil(share * 2 * k));
        const Synthesis r = synthesise(capped);
        const std::string label = "synthesised, V, cap " + std::to_string(static_cast<int>(capped.memory_cap));
        row(label.c_str(), r.schedule, v, base);
      }
    }
  }
  // v-half and v-min at every K: step against 1F1B's, peak against the cap.
  std::printf("\nv-half and v-min at every K (step / 1F1B's at M = 16 and 32; peak memory / its cap, in chunk "
              "activations)\n\n"
              "| K | v-half, M = 16 | M = 32 | peak / cap | v-min, M = 16 | M = 32 | peak / cap |\n"
              "|---|---|---|---|---|---|---|\n");
  for (int k = 2; k <= 8; ++k) {
    std::printf("| %d |", k);
    for (const char* name : {"v-half", "v-min"}) {
      double peak = 0;
      for (int m : {16, 32}) {
        const Schedule s = make_schedule(name, k, m);
        const double base = simulate(make_1f1b(k, m), synthesis_costs(problem(k, 1, m, 2))).makespan;
        std::printf(" %.3f |", simulate(s, synthesis_costs(problem(k, 2, m, 1))).makespan / base);
        const auto peaks = peak_worker_memory(s);
        peak = std::max(peak, *std::max_element(peaks.begin(), peaks.end()));
      }
      std::printf(" %.0f / %.0f |", peak, v_memory_cap(name, k));
    }
    std::printf("\n");
  }
  // A slow, memory-heavy last stage (an LM's output layer: 2x the time, 3x
  // the activations) on 4 workers, M = 16, with the cap 1F1B needs.
  SynthesisProblem lm = problem(4, 1, 16, 1);
  lm.forward.back() = lm.input.back() = lm.weight.back() = 2;
  lm.activation.back() = 3;
  const double base = simulate(make_1f1b(4, 16), synthesis_costs(lm)).makespan;
  const auto one_f_one_b_peaks = peak_worker_memory(make_1f1b(4, 16), lm.activation);
  lm.memory_cap = *std::max_element(one_f_one_b_peaks.begin(), one_f_one_b_peaks.end());
  std::printf("\nA slow last stage (2x time, 3x activations), K = 4, M = 16, cap %.0f (1F1B's peak)\n\n"
              "| schedule | bubble | step / 1F1B's | peak memory |\n|---|---|---|---|\n", lm.memory_cap);
  row("1f1b", make_1f1b(4, 16), lm, base);
  row("zb-h1", make_zb_h1(4, 16), lm, base);
  const Synthesis r = synthesise(lm);
  row(("synthesised (" + r.method + ")").c_str(), r.schedule, lm, base);
  return 0;
}
