#include "examples/common/study_tables.h"

#include "examples/common/flags.h"

#include <algorithm>
#include <iostream>
#include <sstream>

namespace conveyor::examples {

std::string shortest(double value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

// Left-aligned in a column of `width`, with at least one space after it.
std::string pad(std::string s, size_t width) {
  s.resize(std::max(s.size() + 1, width), ' ');
  return s;
}

std::string describe(const Run& r) {
  const std::string best =
      "best test accuracy " + fixed(r.best_accuracy, 2) + "% (epoch " + std::to_string(r.best_epoch) + ")";
  if (r.diverged()) {
    return "DIVERGED in epoch " + std::to_string(r.diverged_epoch) + ": " + r.why +
           (r.best_epoch > 0 ? "; before that " + best : "");
  }
  return best + ", last epoch's train loss " + fixed(r.last_loss, 4) + ", " + fixed(r.seconds_per_epoch, 2) +
         " s/epoch";
}

// A table with a column per method; cell(method, row) fills row `row`.
template <typename Cell>
void print_table(const std::string& title, const std::string& corner, const std::vector<std::string>& rows,
                 const std::vector<std::string>& methods, size_t width, Cell cell) {
  std::cout << "\n" << title << "\n" << pad(corner, 8);
  for (const auto& m : methods) std::cout << pad(m, width);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::cout << "\n" << pad(rows[r], 8);
    for (const auto& m : methods) std::cout << pad(cell(m, r), width);
  }
  std::cout << "\n";
}

StudyMetric best_accuracy_metric() {
  return {"Best test top-1 accuracy (%) over the learning rates, diverged runs left out [lr of the best]:",
          [](const Run& a, const Run& b) { return a.best_accuracy > b.best_accuracy; },
          [](const Run& r) { return fixed(r.best_accuracy, 2) + " [" + shortest(r.lr) + "]"; }};
}

void print_tables(const std::vector<int64_t>& stages, const std::vector<double>& lrs,
                  const std::vector<std::string>& methods, const std::vector<Run>& runs, const StudyMetric& metric) {
  std::vector<std::string> stage_rows, lr_rows;
  for (int64_t k : stages) stage_rows.push_back(std::to_string(k));
  for (double lr : lrs) lr_rows.push_back(shortest(lr));
  // A method's runs with stages[r] stages, or (by_lr) with learning rate lrs[r].
  auto select = [&](const std::string& m, size_t r, bool by_lr) {
    std::vector<const Run*> out;
    for (const auto& run : runs) {
      if (run.method == m && (by_lr ? run.lr == lrs[r] : run.stages == stages[r])) out.push_back(&run);
    }
    return out;
  };
  const size_t w = metric.width;
  print_table(metric.title, "stages", stage_rows, methods, w, [&](const std::string& m, size_t r) {
    const Run* best = nullptr;
    for (const Run* run : select(m, r, false)) {
      if (!run->diverged() && (!best || metric.better(*run, *best))) best = run;
    }
    return best ? metric.cell(*best) : "diverged";
  });
  print_table("Diverged runs / runs, per learning rate (over the numbers of stages):", "lr", lr_rows, methods, w,
              [&](const std::string& m, size_t r) {
                const auto sel = select(m, r, true);
                const auto n = std::count_if(sel.begin(), sel.end(), [](const Run* run) { return run->diverged(); });
                return std::to_string(n) + "/" + std::to_string(sel.size());
              });
  print_table("Training time per epoch (s), mean over the runs that completed an epoch:", "stages", stage_rows, methods,
              w,
              [&](const std::string& m, size_t r) {
                double sum = 0;
                int n = 0;
                for (const Run* run : select(m, r, false)) {
                  if (run->best_epoch > 0) sum += run->seconds_per_epoch, ++n;
                }
                return n ? fixed(sum / n, 2) : std::string("-");
              });
}

}  // namespace conveyor::examples
