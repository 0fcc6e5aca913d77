#include "schedules/schedule.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace conveyor::schedules {

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& s : stages) n += s.size();
  return n;
}

std::string Schedule::str() const {
  std::ostringstream os;
  os << "# schedule " << (name.empty() ? "custom" : name) << " stages=" << num_stages
     << " microbatches=" << num_microbatches << "\n";
  for (const auto& actions : stages) {
    for (size_t i = 0; i < actions.size(); ++i) os << (i ? " " : "") << actions[i].str();
    os << "\n";
  }
  return os.str();
}

namespace {

// "# schedule NAME stages=K microbatches=M": fills the fields it finds.
bool parse_header(const std::string& line, Schedule& s, int line_no) {
  std::istringstream in(line);
  std::string hash, word;
  in >> hash >> word;
  if (hash != "#" || word != "schedule") return false;
  in >> s.name;
  while (in >> word) {
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq);
    int* field = key == "stages" ? &s.num_stages : key == "microbatches" ? &s.num_microbatches : nullptr;
    if (eq == std::string::npos || field == nullptr) {
      throw std::invalid_argument("schedule line " + std::to_string(line_no) + ": unknown header field '" + word +
                                  "' (expected stages=K microbatches=M)");
    }
    try {
      *field = std::stoi(word.substr(eq + 1));
    } catch (const std::exception&) {
      throw std::invalid_argument("schedule line " + std::to_string(line_no) + ": '" + word + "' is not a number");
    }
  }
  return true;
}

}  // namespace

Schedule Schedule::parse(std::string_view text) {
  Schedule s;
  bool have_header = false;
  int max_mb = -1, line_no = 0;
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (line[first] == '#') {
      if (!have_header && s.stages.empty()) have_header = parse_header(line.substr(first), s, line_no);
      continue;
    }
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream words(line);
    std::vector<Action> actions;
    std::string word;
    while (words >> word) {
      try {
        actions.push_back(Action::parse(word));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("schedule line " + std::to_string(line_no) + ": " + e.what());
      }
      max_mb = std::max(max_mb, actions.back().microbatch);
    }
    s.stages.push_back(std::move(actions));
  }
  if (s.stages.empty()) throw std::invalid_argument("schedule text has no action lines");
  if (!have_header || s.num_stages == 0) s.num_stages = static_cast<int>(s.stages.size());
  if (!have_header || s.num_microbatches == 0) s.num_microbatches = max_mb + 1;
  if (s.name.empty()) s.name = "custom";
  return s;
}

}  // namespace conveyor::schedules
