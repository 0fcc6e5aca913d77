#include "plugin/transport/c10d_header.h"

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/StringUtil.h>

#include <stdexcept>
#include <string>

namespace conveyor::c10d_wire {

std::vector<Incoming> decode_header(const int64_t* h, Channel channel, int mb, int from, int max_tensors) {
  if (h[kMagicField] != kMagic || h[kChannel] != static_cast<int64_t>(channel) || h[kMicrobatch] != mb ||
      h[kFrom] != from) {
    throw std::invalid_argument("its header is not a conveyor message for this channel and micro-batch");
  }
  const int64_t count = h[kCount];
  if (count < 0 || count > max_tensors) {
    throw std::invalid_argument(c10::str("its header is corrupt (", count, " tensors)"));
  }
  std::vector<Incoming> incoming(static_cast<size_t>(count));
  int64_t at = kPreambleLength;
  int64_t end = kHeaderBytes;  // of the inline payloads so far
  for (auto& in : incoming) {
    if (at + kSizes > kHeaderLength) throw std::invalid_argument("its header is corrupt (records run past its end)");
    const int64_t* r = h + at;
    in.shape.defined = r[kDefined] != 0;
    if (!in.shape.defined) {
      at += kSizes;
      continue;
    }
    const int64_t ndim = r[kNdim], dtype = r[kDtype], route = r[kRoute];
    if (ndim < 0 || ndim > kHeaderLength - kSizes - at || dtype < 0 ||
        dtype >= static_cast<int64_t>(c10::ScalarType::NumOptions) || route < kNoPayload || route > kInlineRoute) {
      throw std::invalid_argument(
          c10::str("its header is corrupt (ndim ", ndim, ", dtype code ", dtype, ", route ", route, ")"));
    }
    in.shape.sizes.assign(r + kSizes, r + kSizes + ndim);
    int64_t elements = 1;
    for (const int64_t size : in.shape.sizes) {
      if (size < 0 || (size > 0 && elements > kMaxElements / size)) {
        throw std::invalid_argument("its header is corrupt (a tensor of sizes outside [0, 2^48] elements)");
      }
      elements *= size;
    }
    if ((elements == 0) != (route == kNoPayload)) {
      throw std::invalid_argument(
          c10::str("its header is corrupt (a tensor of ", elements, " elements on route ", route, ")"));
    }
    if (route != kNoPayload) {
      int64_t item = 0;
      try {
        item = static_cast<int64_t>(c10::elementSize(static_cast<c10::ScalarType>(dtype)));
      } catch (const std::exception&) {
        throw std::invalid_argument(c10::str("its header is corrupt (dtype code ", dtype, " has no element size)"));
      }
      if (elements * item != r[kBytes]) {
        throw std::invalid_argument(c10::str("its header does not describe its payload: a ",
                                             static_cast<c10::ScalarType>(dtype), " tensor of shape ",
                                             c10::IntArrayRef(in.shape.sizes), " takes ", elements * item,
                                             " bytes, but ", r[kBytes], " follow"));
      }
    }
    if (route == kInlineRoute) {
      // kBytes equals the tensor's size (checked above), so nothing here overflows.
      if (r[kBytes] > kMessageBytes - end) {
        throw std::invalid_argument(
            c10::str("its header is corrupt (inline payloads run past the message's ", kMessageBytes, " bytes)"));
      }
      in.offset = end;
      end += aligned_payload(r[kBytes]);
    }
    in.shape.dtype = static_cast<c10::ScalarType>(dtype);
    in.route = static_cast<Route>(route);
    in.sequence = r[kSequence];
    in.bytes = route == kNoPayload ? 0 : r[kBytes];
    at += kSizes + ndim;
  }
  return incoming;
}

}  // namespace conveyor::c10d_wire
