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

// What a stage does to its parameters and gradients across its replicas
// (the copies of the stage that data parallelism runs side by side), for no
// micro-batch in particular. The text form is the stage and
// torch.distributed.pipelining's name, with no micro-batch: "0UNSHARD".
enum class ShardKind : char {
  kUnshard,     // "UNSHARD": gather the stage's parameters from every replica's shard
  kReshard,     // "RESHARD": free the gathered parameters, keeping this replica's shard
  kReduceGrad,  // "REDUCE_GRAD": reduce the gradients made since the last one across the
                // replicas (reduce-scatter into each replica's shard when gradients are sharded)
};

const char* shard_kind_text(ShardKind kind);  // "UNSHARD", "RESHARD", "REDUCE_GRAD"

struct ShardAction {
  int stage = 0;
  ShardKind kind = ShardKind::kUnshard;

  std::string str() const;
  // True, and `out` set, when `text` is a sharding action ("2RESHARD").
  static bool parse(std::string_view text, ShardAction& out);

  friend bool operator==(const ShardAction&, const ShardAction&) = default;
};

}  // namespace conveyor::schedules
