#include "plugin/export/segments.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>
#include <stdexcept>

namespace conveyor::exported {

namespace {

std::vector<int> reads(const Node& node) {
  std::vector<int> slots;
  for (const Arg& a : node.args) {
    if (a.kind == Arg::Kind::kValue) slots.push_back(a.slot);
    for (int s : a.slots) {
      if (s >= 0) slots.push_back(s);
    }
  }
  return slots;
}

bool within(const std::string& path, const std::string& module) {
  return path == module || path.rfind(module + ".", 0) == 0;
}

std::string layer_name(std::string path) {
  std::replace(path.begin(), path.end(), '.', '_');
  return path.empty() ? "forward" : path;
}

// Where each layer begins without split points: at each change of unit, the
// nodes of the model's own forward ("") staying with the layer before.
std::vector<size_t> unit_starts(const Program& p, std::vector<std::string>& names) {
  std::vector<size_t> starts;
  std::string current;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const std::string& unit = p.nodes[i].unit;
    if (unit.empty() || unit == current) continue;
    starts.push_back(starts.empty() ? 0 : i);
    names.push_back(unit);
    current = unit;
  }
  if (starts.empty()) {
    starts.push_back(0);
    names.push_back("");
  }
  return starts;
}

std::vector<size_t> split_starts(const Program& p, const std::vector<std::string>& split_points,
                                 const std::string& where, std::vector<std::string>& names) {
  std::vector<size_t> starts{0};
  names.push_back(split_points.empty() ? "" : "start");
  size_t from = 0;
  for (const std::string& sp : split_points) {
    size_t i = from;
    while (i < p.nodes.size() && !within(p.nodes[i].module_path, sp)) ++i;
    if (i == p.nodes.size()) {
      std::vector<std::string> called;
      for (size_t j = from; j < p.nodes.size(); ++j) {
        const std::string& u = p.nodes[j].unit;
        if (!u.empty() && std::find(called.begin(), called.end(), u) == called.end()) called.push_back(u);
      }
      throw std::invalid_argument(c10::str(where, ": split point '", sp, "' names no module the program calls",
                                           from == 0 ? std::string() : " after '" + names.back() + "'",
                                           " (it calls ", called.empty() ? "none" : c10::Join(", ", called), ")"));
    }
    if (i == starts.back()) {
      throw std::invalid_argument(c10::str(where, ": split point '", sp, "' would leave the stage before it empty: ",
                                           i == 0 ? "it begins the program" : "it follows the previous one at once"));
    }
    starts.push_back(i);
    names.push_back(sp);
    from = i + 1;
  }
  return starts;
}

}  // namespace

std::vector<Segment> cut_program(const Program& p, const std::vector<std::string>& split_points,
                                 const std::string& where) {
  std::vector<std::string> names;
  const std::vector<size_t> starts =
      split_points.empty() ? unit_starts(p, names) : split_starts(p, split_points, where, names);
  const size_t end = p.nodes.size();
  // The last node (or `end` for the program's outputs) that reads each slot.
  std::vector<size_t> last_use(p.num_slots(), 0);
  std::vector<bool> used(p.num_slots(), false);
  for (size_t i = 0; i < end; ++i) {
    for (int s : reads(p.nodes[i])) {
      last_use[s] = i;
      used[s] = true;
    }
  }
  for (int s : p.outputs) {
    last_use[s] = end;
    used[s] = true;
  }
  // The node that defines each slot; placeholders (inputs, state) before all.
  std::vector<long> defined(p.num_slots(), -1);
  for (size_t i = 0; i < end; ++i) {
    for (const Out& o : p.nodes[i].outs) {
      for (int s : o.slots) {
        if (s >= 0) defined[s] = static_cast<long>(i);
      }
    }
  }
  std::set<int> state_slots;
  for (const State& s : p.state) state_slots.insert(s.slot);
  std::vector<Segment> segments;
  for (size_t k = 0; k < starts.size(); ++k) {
    Segment seg;
    seg.first = starts[k];
    seg.last = k + 1 < starts.size() ? starts[k + 1] : end;
    seg.name = split_points.empty() ? layer_name(names[k]) : "stage" + std::to_string(k);
    const std::string to = k + 1 < starts.size() ? " up to '" + names[k + 1] + "'" : " to the end";
    seg.description = (k == 0 ? "the program from its start" : "the program from '" + names[k] + "'") + to;
    if (k == 0) {
      for (const UserInput& in : p.inputs) {
        if (in.tensor) seg.inputs.push_back(in.slot);
      }
    } else {
      seg.inputs = segments.back().outputs;
    }
    if (k + 1 == starts.size()) {
      seg.outputs = p.outputs;
    } else {
      for (int s = 0; s < p.num_slots(); ++s) {
        const bool before = defined[s] < static_cast<long>(seg.last);
        const bool input = defined[s] >= 0 || std::any_of(p.inputs.begin(), p.inputs.end(), [&](const UserInput& in) {
                             return in.slot == s && in.tensor;
                           });
        if (used[s] && before && input && !state_slots.count(s) && last_use[s] >= seg.last) seg.outputs.push_back(s);
      }
    }
    std::set<std::string> held;
    for (size_t i = seg.first; i < seg.last; ++i) {
      for (int s : reads(p.nodes[i])) {
        for (const State& st : p.state) {
          if (st.slot == s) held.insert(st.name);
        }
      }
    }
    for (const auto& [buffer, slot] : p.buffer_mutations) {
      if (defined[slot] >= static_cast<long>(seg.first) && defined[slot] < static_cast<long>(seg.last)) {
        held.insert(buffer);
      }
    }
    for (const State& st : p.state) {  // a tied weight's names are one (see ExportedModel)
      if (held.erase(st.name)) seg.state.push_back(st.name);
    }
    // Names repeat when a module is called twice, apart: the second is "name_2".
    int repeat = 1;
    for (const Segment& s : segments) repeat += s.name == seg.name || s.name.rfind(seg.name + "_", 0) == 0;
    if (repeat > 1) seg.name += "_" + std::to_string(repeat);
    segments.push_back(std::move(seg));
  }
  return segments;
}

}  // namespace conveyor::exported
