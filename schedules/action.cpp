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

// Reads a non-negative decimal number from the front of `text`, at most 2^30
// (so that one more than the largest stage or micro-batch is still an int).
bool take_number(std::string_view& text, int& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value < 0 || value > (1 << 30)) return false;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return true;
}

}  // namespace

Action Action::parse(std::string_view text) {
  const auto bad = [&](const char* why) {
    std::string message = "'";
    message.append(text).append("' is not an action (").append(why);
    return std::invalid_argument(
        message.append("; expected <stage><F|B|I|W><micro-batch>, e.g. 0F3, or <stage>UNSHARD|RESHARD|REDUCE_GRAD)"));
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

const char* shard_kind_text(ShardKind kind) {
  switch (kind) {
    case ShardKind::kUnshard:
      return "UNSHARD";
    case ShardKind::kReshard:
      return "RESHARD";
    case ShardKind::kReduceGrad:
      return "REDUCE_GRAD";
  }
  return "unknown";
}

std::string ShardAction::str() const { return std::to_string(stage) + shard_kind_text(kind); }

bool ShardAction::parse(std::string_view text, ShardAction& out) {
  std::string_view rest = text;
  int stage = 0;
  if (!take_number(rest, stage)) return false;
  for (const ShardKind kind : {ShardKind::kUnshard, ShardKind::kReshard, ShardKind::kReduceGrad}) {
    if (rest == shard_kind_text(kind)) {
      out = ShardAction{stage, kind};
      return true;
    }
  }
  return false;
}

}  // namespace conveyor::schedules
