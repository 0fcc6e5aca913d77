#pragma once
// What the seed studies (ResNet, BERT) report: one run's outcome, and the
// tables over methods, numbers of stages and learning rates.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace conveyor::examples {

struct Run {
  std::string method;
  int64_t stages = 0;
  double lr = 0;
  double best_accuracy = 0;  // percent (BERT: the last epoch's held-out masked-LM accuracy)
  int64_t best_epoch = 0;    // 0: no epoch completed
  double eval_loss = 0;      // BERT: the last epoch's held-out masked-LM loss
  double last_loss = 0, seconds_per_epoch = 0;
  int64_t diverged_epoch = 0;  // 0: did not diverge
  std::string why;             // what the divergence was
  bool diverged() const { return diverged_epoch > 0; }
};

// One line on a run: its best accuracy, or where and why it diverged.
std::string describe(const Run& r);

// How the first table picks a learning rate's run and shows it.
struct StudyMetric {
  std::string title;
  std::function<bool(const Run& a, const Run& b)> better;  // a better than b (neither diverged)
  std::function<std::string(const Run&)> cell;
  size_t width = 18;  // of a column
};
// The ResNet study's: the best test accuracy, "98.97 [0.05]".
StudyMetric best_accuracy_metric();

// The best run per (stages, method) by `metric`, divergences per (learning
// rate, method), and time per epoch per (stages, method), on standard output.
void print_tables(const std::vector<int64_t>& stages, const std::vector<double>& lrs,
                  const std::vector<std::string>& methods, const std::vector<Run>& runs,
                  const StudyMetric& metric = best_accuracy_metric());

// `value` in the fewest digits that say it ("0.05").
std::string shortest(double value);
// Left-aligned in a column of `width`, with at least one space after it.
std::string pad(std::string s, size_t width);

}  // namespace conveyor::examples
