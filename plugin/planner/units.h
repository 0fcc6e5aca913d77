#pragma once
// Times, sizes and fractions as the planner's text prints them.

#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>

namespace conveyor {

// "12.5 ms" (two decimals under 10 ms).
inline std::string ms(double seconds) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(seconds < 0.01 ? 2 : 1) << seconds * 1e3 << " ms";
  return os.str();
}

// "3.25 MiB" (two decimals under 10 MiB).
inline std::string mib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < (10 << 20) ? 2 : 1) << static_cast<double>(bytes) / (1 << 20)
     << " MiB";
  return os.str();
}

// "12.5%".
inline std::string percent(double fraction) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return os.str();
}

}  // namespace conveyor
