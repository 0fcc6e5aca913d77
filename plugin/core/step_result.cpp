#include "plugin/core/step_result.h"

#include "plugin/support/atomic_file.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {
const char* category(schedules::ActionKind kind) {
  return kind == schedules::ActionKind::kForward ? "forward" : "backward";
}
}  // namespace

std::string StepResult::chrome_trace_json() const {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto comma = [&] {
    if (!first) os << ",";
    first = false;
  };
  for (size_t k = 0; k < trace.size(); ++k) {
    comma();
    os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << k << ",\"args\":{\"name\":\"stage " << k
       << "\"}}";
    for (const TraceEvent& e : trace[k]) {
      comma();
      os << "{\"name\":\"" << e.action.str() << "\",\"cat\":\"" << category(e.action.kind)
         << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << k << ",\"ts\":" << e.start_us
         << ",\"dur\":" << (e.end_us - e.start_us) << ",\"args\":{\"stage\":" << e.action.stage
         << ",\"microbatch\":" << e.action.microbatch << "}}";
    }
  }
  os << "]}\n";
  return os.str();
}

void StepResult::write_chrome_trace(const std::string& path) const {
  write_atomically(path, [this](std::ostream& out) { out << chrome_trace_json(); });
}

}  // namespace conveyor
