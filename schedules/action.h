#pragma once
// Action: one thing one stage does to one micro-batch. Its text form is the
// stage, a letter for the kind and the micro-batch: "0F3" is stage 0's
// forward of micro-batch 3, "1B0" stage 1's backward of micro-batch 0.

#include <ostream>
#include <string>
#include <string_view>

namespace conveyor::schedules {

enum class ActionKind : char {
  kForward = 'F',
  kBackward = 'B',
};

const char* kind_name(ActionKind kind);  // "forward" / "backward"

struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;

  std::string str() const;
  // Parses the text form; throws std::invalid_argument naming the text.
  static Action parse(std::string_view text);

  friend bool operator==(const Action&, const Action&) = default;
};

std::ostream& operator<<(std::ostream& os, const Action& action);

}  // namespace conveyor::schedules
