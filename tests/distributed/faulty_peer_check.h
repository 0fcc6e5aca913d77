#pragma once
// What the ranks of the "faulty" role (distributed_roles.h: a 3-stage 1F1B
// pipeline whose rank 1 dies or stalls mid-step) must report, over Gloo and
// over shared memory alike. Each check reads what the ranks themselves
// measured and decided (their errors, the wait they report, who failed), not
// when their processes happened to exit: a loaded machine under
// AddressSanitizer takes seconds to end a process.

#include "rank_launcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace conveyor::testing {

inline std::string logs(const std::vector<RankExit>& exits) {
  std::ostringstream os;
  for (size_t r = 0; r < exits.size(); ++r) os << "--- rank " << r << " (exit " << exits[r].code << ")\n" << exits[r].log;
  return os.str();
}

// The wait a rank reports in "lost the connection after N ms": how long it
// had waited when it noticed its peer had gone; -1 where it reports none.
inline int64_t lost_connection_after_ms(const std::string& log) {
  static const std::regex pattern("lost the connection after ([0-9]+) ms");
  std::smatch m;
  return std::regex_search(log, m, pattern) ? std::stoll(m[1].str()) : -1;
}

// Rank 1 exited (code 9) in its third forward, under a timeout of
// `timeout_ms`: ranks 0 and 2 fail naming it and what they waited for, having
// noticed the loss, not timed out: the wait each reports (which began a few
// actions before the peer died) ends within half the timeout.
inline void expect_dead_peer_noticed(const std::vector<RankExit>& exits, int64_t timeout_ms) {
  using ::testing::HasSubstr;
  ASSERT_EQ(exits.size(), 3u);
  ASSERT_EQ(exits[1].code, 9) << logs(exits);
  for (int r : {0, 2}) {
    EXPECT_EQ(exits[r].code, 1) << logs(exits);
    EXPECT_THAT(exits[r].log, HasSubstr("conveyor: stage " + std::to_string(r) + " failed in " + std::to_string(r)))
        << logs(exits);
    EXPECT_THAT(exits[r].log, HasSubstr("from rank 1 (stage 1), which has probably exited")) << logs(exits);
    const int64_t waited = lost_connection_after_ms(exits[r].log);
    EXPECT_GE(waited, 0) << logs(exits);
    EXPECT_LT(waited, timeout_ms / 2) << logs(exits);
  }
  // Stage 1 died in its third forward (1F2): stage 2 never got that activation.
  EXPECT_THAT(exits[2].log, HasSubstr("waiting for the activation of micro-batch")) << logs(exits);
  EXPECT_THAT(exits[0].log, HasSubstr("waiting for the gradient of micro-batch")) << logs(exits);
}

// Rank 1 slept 4 s in its second forward (1F1) under a timeout of 1 s. Stage
// 0 waits for the gradient of micro-batch 0, which 1B0 sends only after 1F1,
// and gives up at its timeout; so does stage 2, waiting for 1F1's
// activation. That they gave up while rank 1 still slept, and did not wait
// it out, shows in rank 1: it fails too, on a neighbour that left (had they
// waited, the step would have completed).
inline void expect_stalled_peer_timed_out(const std::vector<RankExit>& exits) {
  using ::testing::AnyOf;
  using ::testing::HasSubstr;
  ASSERT_EQ(exits.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(exits[r].code, 1) << logs(exits);
  EXPECT_THAT(exits[0].log, HasSubstr("conveyor: stage 0 failed in 0B0 (backward of micro-batch 0): rank 0 (stage 0): "
                                      "timed out after 1000 ms waiting for the gradient of micro-batch 0 from rank 1 "
                                      "(stage 1)"))
      << logs(exits);
  EXPECT_THAT(exits[2].log, HasSubstr("rank 2 (stage 2): timed out after 1000 ms waiting for the activation of "
                                      "micro-batch 1 from rank 1 (stage 1)"))
      << logs(exits);
  EXPECT_THAT(exits[1].log, HasSubstr("conveyor: stage 1 failed in 1")) << logs(exits);
  EXPECT_THAT(exits[1].log, AnyOf(HasSubstr("rank 0 (stage 0)"), HasSubstr("rank 2 (stage 2)"))) << logs(exits);
}

}  // namespace conveyor::testing
