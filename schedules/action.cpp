#include "schedules/action.h"

#include <charconv>
#include <stdexcept>

namespace conveyor::schedules {

const char* kind_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kBackwardInput:
      return "input backward";
    case ActionKind::kWeight:
      return "weight backward";
  }
  return "unknown";
}

std::string Action::str() const { return std::to_string(stage) + static_cast<char>(kind) + std::to_string(microbatch); }

namespace {

// Reads a non-negative decimal number from the front of `text`.
bool take_number(std::string_view& text, int& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value < 0) return false;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return true;
}

}  // namespace

Action Action::parse(std::string_view text) {
  const auto bad = [&](const char* why) {
    std::string message = "'";
    message.append(text).append("' is not an action (").append(why);
    return std::invalid_argument(message.append("; expected <stage><F|B|I|W><micro-batch>, e.g. 0F3)"));
  };
  std::string_view rest = text;
  Action action;
  if (!take_number(rest, action.stage)) throw bad("no stage number");
  if (rest.empty()) throw bad("no kind");
  switch (rest.front()) {
    case 'F':
    case 'B':
    case 'I':
    case 'W':
      action.kind = static_cast<ActionKind>(rest.front());
      break;
    default:
      throw bad("unknown kind");
  }
  rest.remove_prefix(1);
  if (!take_number(rest, action.microbatch)) throw bad("no micro-batch number");
  if (!rest.empty()) throw bad("trailing characters");
  return action;
}

std::ostream& operator<<(std::ostream& os, const Action& action) { return os << action.str(); }

}  // namespace conveyor::schedules
