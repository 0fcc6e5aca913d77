#pragma once
// The c10d transport's message header: kHeaderLength int64 values, a preamble
// then one record per tensor. decode_header() reads a header that arrived from
// another process and trusts none of its fields: it returns the tensors the
// message announces, or throws std::invalid_argument saying what is wrong.
// Pure (no LibTorch calls), so a fuzzer drives it directly (tests/fuzz).

#include "plugin/transport/transport.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace conveyor::c10d_wire {

inline constexpr int64_t kMagic = 0x436f6e76;  // "Conv": a header out of step with its stream is caught at once
enum Preamble : int64_t { kMagicField, kChannel, kMicrobatch, kFrom, kCount, kPreambleLength };
// kBytes: the payload's size in bytes, taken from the tensor sent, not from
// the other fields: a header whose dtype or sizes do not describe its payload
// is refused, where Gloo would otherwise end the receiving process (a payload
// larger than the buffer posted for it fails an assertion in its I/O thread).
enum Record : int64_t { kDefined, kDtype, kRoute, kSequence, kBytes, kNdim, kSizes };
inline constexpr int64_t kHeaderLength = 256;
// No tensor crossing a boundary has more elements than this (2^48): a larger
// size can only be a corrupt header, and must not become an allocation.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// How a payload travels: none (undefined or empty tensor), through host memory
// on the main group as a message of its own, on the accelerator group, or
// inline: in the header's own message, right after the header.
enum Route : int64_t { kNoPayload = 0, kHostRoute = 1, kDeviceRoute = 2, kInlineRoute = 3 };

// A message's first part is kHeaderBytes of header, then its inline payloads,
// each at a multiple of kPayloadAlignment; it is at most kMessageBytes long
// (every receiver posts a buffer of that size). A message whose host payloads
// do not fit sends them on their own tags instead.
inline constexpr int64_t kHeaderBytes = kHeaderLength * static_cast<int64_t>(sizeof(int64_t));
inline constexpr int64_t kMessageBytes = int64_t{1} << 20;
inline constexpr int64_t kPayloadAlignment = 64;
inline constexpr int64_t aligned_payload(int64_t bytes) {
  return (bytes + kPayloadAlignment - 1) / kPayloadAlignment * kPayloadAlignment;
}

// What one tensor of a message is.
struct Sent {
  bool defined = false;
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};

struct Incoming {
  Sent shape;
  Route route = kNoPayload;
  int64_t sequence = 0;  // the order of accelerator payloads
  int64_t bytes = 0;     // the payload's size
  int64_t offset = 0;    // inline: where it starts in the message
};

// The tensors announced by `header` (kHeaderLength values) for `channel`,
// micro-batch `mb`, sent by stage `from`; at most `max_tensors` of them.
// Inline payloads get their offsets, which stay within kMessageBytes.
std::vector<Incoming> decode_header(const int64_t* header, Channel channel, int mb, int from, int max_tensors);

}  // namespace conveyor::c10d_wire
