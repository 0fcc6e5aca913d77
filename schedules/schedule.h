#pragma once
// Schedule: the ordered actions of every stage. It prints and parses as text,
// one line per stage after a header, so schedules diff and load as files:
//
//   # schedule 1f1b stages=2 microbatches=2
//   0F0 0F1 0B0 0B1
//   1F0 1B0 1F1 1B1

#include "schedules/action.h"

#include <string>
#include <string_view>
#include <vector>

namespace conveyor::schedules {

struct Schedule {
  std::string name;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<std::vector<Action>> stages;  // stages[k]: what stage k does, in order

  size_t num_actions() const;
  std::string str() const;

  // Reads the text form. The header is optional: without it the stage count is
  // the number of action lines and the micro-batch count one more than the
  // largest micro-batch named. Actions may be separated by spaces or commas;
  // blank lines and other lines starting with '#' are ignored. Throws
  // std::invalid_argument naming the line and the offending text. Parsing
  // does not validate: see validate().
  static Schedule parse(std::string_view text);

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

}  // namespace conveyor::schedules
