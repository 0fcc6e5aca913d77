// libFuzzer target: the c10d transport's header decoder, which reads what
// another process sent. Any header may be refused with std::invalid_argument;
// nothing may crash or trip a sanitizer, and what it accepts must describe
// tensors that can be allocated (non-negative sizes, at most 2^48 elements).
#include "plugin/transport/c10d_header.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace conveyor::c10d_wire;
  int64_t header[kHeaderLength] = {};
  std::memcpy(header, data, std::min(size, sizeof(header)));
  // Answer the header's own channel, micro-batch and sender, so that the
  // fuzzer reaches the records; a mismatch there is tested in the unit tests.
  const auto as_int = [](int64_t v) {
    return v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max() ? static_cast<int>(v) : 0;
  };
  const auto channel = (header[kChannel] & 1) ? conveyor::Channel::kGradient : conveyor::Channel::kActivation;
  try {
    const auto incoming = decode_header(header, channel, as_int(header[kMicrobatch]), as_int(header[kFrom]), 16);
    for (const auto& in : incoming) {
      if (!in.shape.defined) continue;
      int64_t elements = 1;
      for (const int64_t s : in.shape.sizes) {
        if (s < 0 || (s > 0 && elements > kMaxElements / s)) {
          std::fprintf(stderr, "fuzz_c10d_header: accepted a size that cannot be allocated\n");
          std::abort();
        }
        elements *= s;
      }
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
