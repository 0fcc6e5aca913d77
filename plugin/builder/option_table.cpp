#include "plugin/builder/option_table.h"

#include "schedules/generators.h"

#include <c10/util/StringUtil.h>

#include <algorithm>

namespace conveyor {

std::vector<OptionDescription> every_option(const PipelineOptions& options) {
  std::vector<OptionDescription> rows;
  describe_options(options, rows);  // section by section
  // The schedule's names are the schedule library's list, not the row's.
  for (auto& row : rows) {
    if (row.name != "schedule") continue;
    const auto quoted = [](const std::vector<std::string>& names) {
      std::string text;
      for (const auto& n : names) text += (text.empty() ? "\"" : ", \"") + n + "\"";
      return text;
    };
    row.doc += c10::str(" Synchronous: ", quoted(schedules::schedule_names(true)), "; asynchronous: ",
                        quoted(schedules::schedule_names(false)), ".");
  }
  return rows;
}

std::vector<OptionDescription> every_option() { return every_option(PipelineOptions()); }

std::string options_reference() {
  const auto cell = [](std::string text) {  // a markdown table cell: '|' escaped
    for (size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) text.insert(at, "\\");
    return text;
  };
  std::string out, section;
  for (const OptionDescription& row : every_option()) {
    if (row.section != section) {
      section = row.section;
      out += c10::str(out.empty() ? "" : "\n", "# ", section,
                      "\n\n| Option | Python type | Default | What it does |\n|---|---|---|---|\n");
    }
    std::string doc = row.doc;
    if (!row.choices.empty()) {
      std::vector<const char*> names;
      for (const std::string& c : row.choices) names.push_back(c.c_str());
      doc += " One of " + choice_text(names.data(), names.size()) + ".";
    }
    if (!row.bound.empty()) doc += " Must be " + row.bound + ".";
    const bool python = !row.type.empty();
    out += c10::str("| `", row.name, "` | ", python ? "`" + cell(row.type) + "`" : "C++ only", " | ",
                    python ? "`" + python_repr(row.default_value) + "`" : "", " | ", cell(doc), " |\n");
  }
  return out;
}

}  // namespace conveyor
