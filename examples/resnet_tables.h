#pragma once
// What the ResNet study reports: one run's outcome, and the tables over
// methods, numbers of stages and learning rates.

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::examples {

struct Run {
  std::string method;
  int64_t stages = 0;
  double lr = 0;
  double best_accuracy = 0;  // percent
  int64_t best_epoch = 0;    // 0: no epoch completed
  double last_loss = 0, seconds_per_epoch = 0;
  int64_t diverged_epoch = 0;  // 0: did not diverge
  std::string why;             // what the divergence was
  bool diverged() const { return diverged_epoch > 0; }
};

// One line on a run: its best accuracy, or where and why it diverged.
std::string describe(const Run& r);

// Best accuracy per (stages, method), divergences per (learning rate,
// method), and time per epoch per (stages, method), on standard output.
void print_tables(const std::vector<int64_t>& stages, const std::vector<double>& lrs,
                  const std::vector<std::string>& methods, const std::vector<Run>& runs);

// `value` in the fewest digits that say it ("0.05").
std::string shortest(double value);
// Left-aligned in a column of `width`, with at least one space after it.
std::string pad(std::string s, size_t width);

}  // namespace conveyor::examples
