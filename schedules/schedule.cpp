#include "schedules/schedule.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace conveyor::schedules {

bool Schedule::splits_backward() const {
  for (const auto& line : workers) {
    for (const Action& a : line) {
      if (a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kWeight) return true;
    }
  }
  return false;
}

bool Schedule::has_sharding() const {
  return std::any_of(sharding.begin(), sharding.end(), [](const auto& line) { return !line.empty(); });
}

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& line : workers) n += line.size();
  return n;
}

std::string Schedule::str() const {
  std::ostringstream os;
  os << "# schedule " << (name.empty() ? "custom" : name) << " stages=" << num_stages
     << " microbatches=" << num_microbatches;
  if (stash == Stash::kInputs) os << " stash=inputs";
  if (stash == Stash::kOffload) os << " stash=offload";
  if (weight_stashing) os << " weights=stashed";
  if (step_per_microbatch) os << " step=microbatch";
  if (vertical_sync) os << " sync=vertical";
  os << "\n";
  for (size_t w = 0; w < workers.size(); ++w) {
    const std::vector<size_t> none;
    const std::vector<PlacedShard> unsharded;
    const auto& cuts = w < barriers.size() ? barriers[w] : none;
    const auto& shards = w < sharding.size() ? sharding[w] : unsharded;
    size_t next_cut = 0, next_shard = 0;
    bool first = true;
    for (size_t i = 0; i <= workers[w].size(); ++i) {
      for (; next_cut < cuts.size() && cuts[next_cut] == i; ++next_cut) {
        os << (first ? "" : " ") << "|";
        first = false;
      }
      for (; next_shard < shards.size() && shards[next_shard].position == i; ++next_shard) {
        os << (first ? "" : " ") << shards[next_shard].action.str();
        first = false;
      }
      if (i == workers[w].size()) break;
      os << (first ? "" : " ") << workers[w][i].str();
      first = false;
    }
    os << "\n";
  }
  return os.str();
}

namespace {

[[noreturn]] void bad_line(int line_no, const std::string& what) {
  throw std::invalid_argument("schedule line " + std::to_string(line_no) + ": " + what);
}

// Reads "KEY=VALUE" of the header into the schedule.
void parse_field(const std::string& word, Schedule& s, int line_no) {
  const auto eq = word.find('=');
  const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
  const auto number = [&](int& field) {
    try {
      size_t used = 0;
      field = std::stoi(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      bad_line(line_no, "'" + word + "' is not a number");
    }
  };
  const auto choice = [&](const char* a, const char* b) {
    if (value != a && value != b)
      bad_line(line_no, "'" + word + "': expected " + key + "=" + a + " or " + key + "=" + b);
    return value == a;
  };
  if (key == "stages") {
    number(s.num_stages);
  } else if (key == "microbatches") {
    number(s.num_microbatches);
  } else if (key == "stash") {
    if (value == "offload") {
      s.stash = Stash::kOffload;
    } else {
      s.stash = choice("inputs", "activations") ? Stash::kInputs : Stash::kActivations;
    }
  } else if (key == "weights") {
    s.weight_stashing = choice("stashed", "live");
  } else if (key == "step") {
    s.step_per_microbatch = choice("microbatch", "batch");
  } else if (key == "sync") {
    s.vertical_sync = choice("vertical", "none");
  } else {
    bad_line(line_no,
             "unknown header field '" + word + "' (expected stages=K microbatches=M stash= weights= step= sync=)");
  }
}

// "# schedule NAME KEY=VALUE...": fills the fields it finds.
bool parse_header(const std::string& line, Schedule& s, int line_no) {
  std::istringstream in(line);
  std::string hash, word;
  in >> hash >> word;
  if (hash != "#" || word != "schedule") return false;
  in >> s.name;
  while (in >> word) parse_field(word, s, line_no);
  return true;
}

// Each stage runs on the worker whose line names it first (validate() rejects
// a stage named on two lines or on none). One stage per line, in order, is the
// default placement and is left empty.
void read_placement(Schedule& s) {
  if (s.num_stages < 1 || s.num_stages > (1 << 20)) return;  // validate() names the count
  std::vector<int> placement(s.num_stages, -1);
  bool identity = s.num_workers() == s.num_stages;
  for (int w = 0; w < s.num_workers(); ++w) {
    for (const Action& a : s.workers[w]) {
      if (a.stage < 0 || a.stage >= s.num_stages) continue;
      if (placement[a.stage] < 0) placement[a.stage] = w;
      identity = identity && a.stage == w;
    }
  }
  if (!identity) s.placement = std::move(placement);
}

}  // namespace

Schedule Schedule::parse(std::string_view text) {
  Schedule s;
  bool have_header = false;
  int max_mb = -1, max_stage = -1, line_no = 0;
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    ++line_no;
    // Blank: nothing but whitespace (as words are split: \f and \v too) and separators.
    const auto first = line.find_first_not_of(" \t\r\f\v,");
    if (first == std::string::npos) continue;
    if (line[first] == '#') {
      if (!have_header && s.workers.empty()) have_header = parse_header(line.substr(first), s, line_no);
      continue;
    }
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream words(line);
    std::vector<Action> actions;
    std::vector<size_t> cuts;
    std::vector<PlacedShard> shards;
    std::string word;
    while (words >> word) {
      if (word == "|") {
        cuts.push_back(actions.size());
        continue;
      }
      if (ShardAction shard; ShardAction::parse(word, shard)) {
        shards.push_back({actions.size(), shard});
        max_stage = std::max(max_stage, shard.stage);
        continue;
      }
      try {
        actions.push_back(Action::parse(word));
      } catch (const std::invalid_argument& e) {
        bad_line(line_no, e.what());
      }
      max_mb = std::max(max_mb, actions.back().microbatch);
      max_stage = std::max(max_stage, actions.back().stage);
    }
    s.workers.push_back(std::move(actions));
    s.barriers.push_back(std::move(cuts));
    s.sharding.push_back(std::move(shards));
  }
  if (s.workers.empty()) throw std::invalid_argument("schedule text has no action lines");
  if (std::all_of(s.barriers.begin(), s.barriers.end(), [](const auto& b) { return b.empty(); })) s.barriers.clear();
  if (!s.has_sharding()) s.sharding.clear();
  if (!have_header || s.num_stages == 0) s.num_stages = std::max(max_stage + 1, static_cast<int>(s.workers.size()));
  if (!have_header || s.num_microbatches == 0) s.num_microbatches = max_mb + 1;
  if (s.name.empty()) s.name = "custom";
  read_placement(s);
  return s;
}

std::vector<Action> stage_actions(const Schedule& s, int k) {
  std::vector<Action> out;
  const int w = s.worker_of(k);
  if (w < 0 || w >= s.num_workers()) return out;
  for (const Action& a : s.workers[w]) {
    if (a.stage == k) out.push_back(a);
  }
  return out;
}

std::vector<std::vector<int>> forward_versions(const Schedule& s) {
  std::vector<std::vector<int>> versions(s.workers.size(), std::vector<int>(s.num_microbatches, 0));
  for (size_t k = 0; k < s.workers.size(); ++k) {
    int steps = 0;
    for (const Action& a : s.workers[k]) {
      if (a.kind == ActionKind::kBackward) ++steps;
      if (a.kind == ActionKind::kForward && a.microbatch >= 0 && a.microbatch < s.num_microbatches) {
        versions[k][a.microbatch] = steps;
      }
    }
  }
  if (s.vertical_sync) {
    for (size_t k = 1; k < versions.size(); ++k) versions[k] = versions[0];
  }
  return versions;
}

}  // namespace conveyor::schedules
