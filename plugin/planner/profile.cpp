#include "plugin/planner/profile.h"

#include <iomanip>
#include <sstream>

namespace conveyor {

namespace {

double scaled(double at_batch, double fixed, int64_t batch, double n) {
  return fixed + (at_batch - fixed) * n / static_cast<double>(batch);
}

}  // namespace

double LinkProfile::seconds(int64_t bytes) const {
  return latency_seconds + (bytes_per_second > 0 ? static_cast<double>(bytes) / bytes_per_second : 0.0);
}

double LinkProfile::cpu_seconds(int64_t bytes) const {
  return cpu_seconds_per_transfer + cpu_seconds_per_byte * static_cast<double>(bytes);
}

double ModelProfile::forward_seconds(size_t i, double n) const {
  return scaled(layers[i].forward_seconds, layers[i].forward_fixed, batch_size, n);
}
double ModelProfile::backward_seconds(size_t i, double n) const {
  return scaled(layers[i].backward_seconds, layers[i].backward_fixed, batch_size, n);
}
double ModelProfile::input_backward_seconds(size_t i, double n) const {
  const LayerProfile& l = layers[i];
  return l.backward_seconds > 0 ? backward_seconds(i, n) * l.input_backward_seconds / l.backward_seconds : 0.0;
}
double ModelProfile::weight_backward_seconds(size_t i, double n) const {
  const LayerProfile& l = layers[i];
  return l.backward_seconds > 0 ? backward_seconds(i, n) * l.weight_backward_seconds / l.backward_seconds : 0.0;
}
double ModelProfile::loss_seconds(double n) const {
  return (loss_forward_seconds + loss_backward_seconds) * n / static_cast<double>(batch_size);
}

std::string ModelProfile::str() const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  os << "profile on " << device << ", " << batch_size << " samples per micro-batch; link: " << link.kind << ", "
     << link.latency_seconds * 1e6 << " us";
  if (link.bytes_per_second > 0) os << " + " << link.bytes_per_second / 1e9 << " GB/s";
  if (link.cpu_seconds_per_transfer > 0) {
    os << ", " << link.cpu_seconds_per_transfer * 1e6 << " us + " << link.cpu_seconds_per_byte * 1e9
       << " ns/byte of CPU a transfer";
  }
  if (!host_link.kind.empty()) {
    os << "; to host memory " << host_link.latency_seconds * 1e6 << " us + " << host_link.bytes_per_second / 1e9
       << " GB/s";
  }
  if (cores > 0) os << "; " << cores << " workers compute at once";
  if (slowdown.size() > 1) {
    os << ", each slower by";
    for (size_t n = 1; n < slowdown.size(); ++n) {
      os << (n > 1 ? ", " : " ") << "x" << slowdown[n] << " (" << n + 1 << ")";
    }
  }
  os << "; runtime " << action_overhead_seconds * 1e3 << " ms an action";
  if (crowded_action_overhead_seconds > 0) {
    os << ", " << crowded_action_overhead_seconds * 1e3 << " ms beyond the cores";
  }
  os << "\n  layer                                                          fwd ms   bwd ms  (I ms    W ms)   out KiB  "
        "weights KiB\n";
  for (const LayerProfile& l : layers) {
    os << "  " << std::left << std::setw(60) << l.name << std::right << std::setw(9) << l.forward_seconds * 1e3
       << std::setw(9) << l.backward_seconds * 1e3 << std::setw(8) << l.input_backward_seconds * 1e3 << std::setw(8)
       << l.weight_backward_seconds * 1e3 << std::setw(10) << l.output_bytes / 1024.0 << std::setw(13)
       << l.parameter_bytes / 1024.0 << "\n";
  }
  os << "  " << std::left << std::setw(60) << "loss" << std::right << std::setw(9) << loss_forward_seconds * 1e3
     << std::setw(9) << loss_backward_seconds * 1e3 << "\n";
  return os.str();
}

}  // namespace conveyor
