#include "examples/common/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <numeric>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace conveyor::examples {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-:--";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char text[32];
  if (h > 0) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", static_cast<long long>(h), static_cast<long long>(m),
                  static_cast<long long>(s));
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", static_cast<long long>(m), static_cast<long long>(s));
  }
  return text;
}

std::string format_count(double value) {
  if (!std::isfinite(value)) return "-";
  const std::string digits = std::to_string(std::llround(std::fabs(value)));
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped.push_back(',');
    grouped.push_back(digits[i]);
  }
  return (value < 0 && std::llround(value) != 0 ? "-" : "") + grouped;
}

std::string ProgressLine::str(int bar_width) const {
  std::ostringstream os;
  const int digits = static_cast<int>(std::to_string(total).size());
  os << "step " << std::setw(digits) << step << "/" << total;
  if (bar_width > 0 && total > 0) {
    const auto filled =
        static_cast<int>(static_cast<double>(bar_width) * static_cast<double>(step) / static_cast<double>(total));
    os << " [";
    for (int i = 0; i < bar_width; ++i) os << (i < filled ? '=' : i == filled ? '>' : '.');
    os << "]";
  }
  os << std::fixed << std::setprecision(3) << "  loss " << loss << std::setprecision(1) << "  ppl " << std::exp(loss)
     << "  " << format_count(tokens_per_second) << " tok/s  " << format_duration(elapsed_seconds) << " elapsed  ETA "
     << format_duration(eta_seconds);
  return os.str();
}

ProgressBar::ProgressBar(std::ostream& out, int64_t total_steps, bool interactive, int64_t every)
    : out_(out),
      total_(total_steps),
      interactive_(interactive),
      every_(every),
      start_(std::chrono::steady_clock::now()) {
  if (total_steps < 1) throw std::invalid_argument("progress: total_steps must be at least 1");
  if (every < 1) throw std::invalid_argument("progress: every must be at least 1");
}

bool ProgressBar::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

void ProgressBar::update(int64_t step, double loss, double tokens_per_second) {
  recent_losses_.push_back(loss);
  if (static_cast<int64_t>(recent_losses_.size()) > every_) recent_losses_.pop_front();
  if (!interactive_ && step % every_ != 0 && step != total_) return;

  ProgressLine line;
  line.step = step;
  line.total = total_;
  line.loss =
      std::accumulate(recent_losses_.begin(), recent_losses_.end(), 0.0) / static_cast<double>(recent_losses_.size());
  line.tokens_per_second = tokens_per_second;
  line.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  line.eta_seconds =
      step > 0 ? line.elapsed_seconds / static_cast<double>(step) * static_cast<double>(total_ - step) : -1.0;
  if (interactive_) {
    out_ << "\r" << line.str() << "\033[K" << std::flush;  // ESC[K: clear what a longer line left
    bar_drawn_ = true;
  } else {
    out_ << line.str(0) << "\n" << std::flush;
  }
}

void ProgressBar::note(const std::string& line) {
  if (bar_drawn_) out_ << "\r\033[K";
  out_ << line << "\n" << std::flush;
  bar_drawn_ = false;
}

void ProgressBar::finish() {
  if (bar_drawn_) out_ << "\n" << std::flush;
  bar_drawn_ = false;
}

}  // namespace conveyor::examples
