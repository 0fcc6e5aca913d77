// The c10d transport's header decoder (plugin/transport/c10d_header.h): what a
// process accepts from another, field by field. (tests/fuzz drives it with
// arbitrary headers; these are the cases, each with its message.)
#include "plugin/transport/c10d_header.h"

#include "error_of.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace conveyor::c10d_wire {
namespace {

using ::testing::HasSubstr;

// Index of the first tensor record (an int: the header's enums do not mix).
constexpr int64_t kRecord0 = kPreambleLength;

// A header of one float32 tensor of `sizes` on the host route, from stage 0, micro-batch 3.
std::vector<int64_t> header(std::vector<int64_t> sizes, int64_t route = kHostRoute) {
  std::vector<int64_t> h(kHeaderLength, 0);
  h[kMagicField] = kMagic;
  h[kChannel] = static_cast<int64_t>(Channel::kActivation);
  h[kMicrobatch] = 3;
  h[kFrom] = 0;
  h[kCount] = 1;
  int64_t* r = h.data() + kPreambleLength;
  r[kDefined] = 1;
  r[kDtype] = static_cast<int64_t>(c10::ScalarType::Float);
  r[kRoute] = route;
  r[kNdim] = static_cast<int64_t>(sizes.size());
  int64_t elements = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    r[kSizes + d] = sizes[d];
    elements *= sizes[d];
  }
  r[kBytes] = route == kNoPayload ? 0 : 4 * elements;
  return h;
}

std::string error_of(const std::vector<int64_t>& h, int mb = 3) {
  return testing::error_of([&] { decode_header(h.data(), Channel::kActivation, mb, 0, 16); });
}

TEST(C10dHeader, DecodesWhatTheSenderWrote) {
  const auto in = decode_header(header({4, 16}).data(), Channel::kActivation, 3, 0, 16);
  ASSERT_EQ(in.size(), 1u);
  EXPECT_TRUE(in[0].shape.defined);
  EXPECT_EQ(in[0].shape.sizes, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(in[0].shape.dtype, c10::ScalarType::Float);
  EXPECT_EQ(in[0].route, kHostRoute);
  const auto empty = decode_header(header({0, 7}, kNoPayload).data(), Channel::kActivation, 3, 0, 16);
  EXPECT_EQ(empty[0].shape.sizes, (std::vector<int64_t>{0, 7}));
}

TEST(C10dHeader, PlacesInlinePayloadsAfterTheHeaderAndWithinTheMessage) {
  auto h = header({4, 16}, kInlineRoute);
  h[kCount] = 2;
  int64_t* second = h.data() + kRecord0 + kSizes + 2;
  std::copy(h.begin() + kRecord0, h.begin() + kRecord0 + kSizes + 2, second);
  second[kSizes] = 3;  // [3, 16] floats: 192 bytes
  second[kBytes] = 192;
  const auto in = decode_header(h.data(), Channel::kActivation, 3, 0, 16);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].offset, kHeaderBytes);
  EXPECT_EQ(in[0].bytes, 256);
  EXPECT_EQ(in[1].offset, kHeaderBytes + 256);
  EXPECT_EQ(in[1].bytes, 192);
  EXPECT_EQ(aligned_payload(192), 192);
  EXPECT_EQ(aligned_payload(193), 256);

  // A payload that would run past the buffer every receiver posts is refused.
  const int64_t rows = (kMessageBytes - kHeaderBytes) / 64 + 1;  // rows of 16 floats, one too many
  EXPECT_THAT(error_of(header({rows, 16}, kInlineRoute)), HasSubstr("inline payloads run past the message's 1048576"));
  EXPECT_NO_THROW(decode_header(header({rows - 1, 16}, kInlineRoute).data(), Channel::kActivation, 3, 0, 16));
}

TEST(C10dHeader, RefusesEveryCorruptFieldNamingIt) {
  auto h = header({4, 16});
  EXPECT_THAT(error_of(h, /*mb=*/4), HasSubstr("not a conveyor message for this channel and micro-batch"));
  h[kMagicField] = 0;
  EXPECT_THAT(error_of(h), HasSubstr("not a conveyor message"));
  h = header({4, 16});
  h[kCount] = 17;
  EXPECT_THAT(error_of(h), HasSubstr("corrupt (17 tensors)"));
  h[kCount] = -1;
  EXPECT_THAT(error_of(h), HasSubstr("corrupt (-1 tensors)"));
  h = header({4, 16});
  h[kRecord0 + kNdim] = kHeaderLength;
  EXPECT_THAT(error_of(h), HasSubstr("corrupt (ndim 256"));
  h = header({4, 16});
  h[kRecord0 + kDtype] = 999;
  EXPECT_THAT(error_of(h), HasSubstr("dtype code 999"));
  h = header({4, 16});
  h[kRecord0 + kRoute] = 7;
  EXPECT_THAT(error_of(h), HasSubstr("route 7"));
  EXPECT_THAT(error_of(header({4, -16})), HasSubstr("sizes outside [0, 2^48] elements"));
  EXPECT_THAT(error_of(header({int64_t{1} << 30, int64_t{1} << 30})), HasSubstr("sizes outside [0, 2^48]"));
  EXPECT_THAT(error_of(header({0, 16}, kHostRoute)), HasSubstr("a tensor of 0 elements on route 1"));
  EXPECT_THAT(error_of(header({4, 16}, kNoPayload)), HasSubstr("a tensor of 64 elements on route 0"));
  // Fields that do not describe the payload that follows (a lying dtype or
  // shape): Gloo would abort the receiver if the payload were received.
  h = header({4, 16});
  h[kRecord0 + kDtype] = static_cast<int64_t>(c10::ScalarType::Double);
  EXPECT_THAT(error_of(h), HasSubstr("does not describe its payload: a Double tensor of shape [4, 16] takes 512 bytes, "
                                     "but 256 follow"));
  h = header({4, 16});
  h[kRecord0 + kSizes + 1] = 17;
  EXPECT_THAT(error_of(h), HasSubstr("a Float tensor of shape [4, 17] takes 272 bytes, but 256 follow"));
  h = header({});
  h[kCount] = 16;  // 16 undefined records fit; defined ones that overflow the header do not
  for (int i = 0; i < 16; ++i) h[kRecord0 + i * kSizes] = 0;
  EXPECT_EQ(decode_header(h.data(), Channel::kActivation, 3, 0, 16).size(), 16u);
  h = header({});
  h[kCount] = 2;
  h[kRecord0 + kNdim] = kHeaderLength - kRecord0 - kSizes;  // fills the header
  h[kRecord0 + kRoute] = kNoPayload;
  EXPECT_THAT(error_of(h), HasSubstr("records run past its end"));
}

}  // namespace
}  // namespace conveyor::c10d_wire
