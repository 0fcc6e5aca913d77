#pragma once
// Action: one thing one stage does to one micro-batch. Its text form is the
// stage, a letter for the kind and the micro-batch: "0F3" is stage 0's
// forward of micro-batch 3, "1B0" stage 1's backward of micro-batch 0. The
// letters are torch.distributed.pipelining's, so its schedules read as ours.
//
// A backward may be split in two (zero-bubble schedules): "I" computes only
// the gradient of the stage's inputs, which the previous stage waits for, and
// "W" later computes the weights' gradients from what I kept. Together they
// do exactly what one "B" does.

#include <ostream>
#include <string>
#include <string_view>

namespace conveyor::schedules {

enum class ActionKind : char {
  kForward = 'F',
  kBackward = 'B',       // the whole backward: input and weight gradients
  kBackwardInput = 'I',  // the input gradients only; its W follows later
  kWeight = 'W',         // the weight gradients of a micro-batch whose I ran
};

const char* kind_name(ActionKind kind);  // "forward", "backward", "input backward", "weight backward"

// True for B and I: the actions that receive a gradient and send one back.
inline bool is_backward(ActionKind kind) { return kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput; }

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
