#pragma once
// A one-line training progress report on a stream (stderr in the examples):
//
//   step  120/600 [=====>..............]  loss 5.231  ppl 187.0  8,412 tok/s  0:45 elapsed  ETA 3:00
//
// On a terminal the line is redrawn in place with '\r'; otherwise (a CI log,
// a pipe) it is printed as a plain line every `every` steps and at the last
// step, so logs stay readable. The loss shown is the mean over the last
// `every` steps; the ETA extrapolates the mean time per step so far.

#include <chrono>
#include <cstdint>
#include <deque>
#include <iosfwd>
#include <string>

namespace conveyor::examples {

// "0:07", "3:05", "1:02:03"; negative or non-finite durations read "-:--".
std::string format_duration(double seconds);

// "8,412": a count with thousands separators, rounded to an integer.
std::string format_count(double value);

// What one line shows; pure, so the format can be checked without a clock.
struct ProgressLine {
  int64_t step = 0, total = 0;
  double loss = 0;  // nats per token; ppl = exp(loss)
  double tokens_per_second = 0;
  double elapsed_seconds = 0;
  double eta_seconds = 0;
  std::string str(int bar_width = 20) const;
};

class ProgressBar {
 public:
  // `every` >= 1: lines between plain prints (non-interactive) and the
  // number of steps the shown loss averages over.
  ProgressBar(std::ostream& out, int64_t total_steps, bool interactive, int64_t every);

  // True when stderr is a terminal.
  static bool stderr_is_tty();

  // After step `step` (1-based) whose loss was `loss`; `tokens_per_second` is
  // the caller's training throughput so far.
  void update(int64_t step, double loss, double tokens_per_second);

  // A line of its own (an evaluation result), printed without garbling the bar.
  void note(const std::string& line);

  // Ends the bar's line on a terminal; a no-op otherwise.
  void finish();

 private:
  std::ostream& out_;
  int64_t total_;
  bool interactive_;
  int64_t every_;
  std::chrono::steady_clock::time_point start_;
  std::deque<double> recent_losses_;
  bool bar_drawn_ = false;
};

}  // namespace conveyor::examples
