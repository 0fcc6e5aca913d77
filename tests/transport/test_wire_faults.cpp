// Faults on the wire between processes (c10d over Gloo, loopback): a peer that
// dies half-way through a message, stalls past the timeout, closes its
// connections, or sends a header whose magic, channel, micro-batch, dtype or
// shape is wrong. Each time every rank that lives ends its step with an error
// naming the cause (no rank hangs: the launcher would kill it), and its
// weights and optimizer state are those of the last good step. The test
// binary starts copies of itself as the ranks (rank_launcher.h); each case's
// rank and send come from its seed (wire_fault_roles.h).

#include "rank_launcher.h"
#include "wire_fault_roles.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace conveyor::testing {


namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Outcome {
  std::vector<RankExit> exits;
  std::vector<std::string> errors, kept;
  std::string logs;
};

Outcome run_fault(const std::string& kind, uint32_t seed) {
  const std::string out =
      (fs::temp_directory_path() / ("conveyor-wire-" + std::to_string(::getpid()) + "-" + kind)).string();
  Outcome o;
  o.exits = launch("wire", 2, out, {{"CONVEYOR_TEST_FAULT", kind}, {"CONVEYOR_TEST_SEED", std::to_string(seed)}});
  std::ostringstream logs;
  for (int r = 0; r < 2; ++r) {
    o.errors.push_back(text_of(out + "/error-rank" + std::to_string(r) + ".txt"));
    o.kept.push_back(text_of(out + "/kept-rank" + std::to_string(r) + ".txt"));
    logs << "--- rank " << r << " (exit " << o.exits[r].code << "): " << o.errors[r] << "\n" << o.exits[r].log;
  }
  o.logs = logs.str();
  fs::remove_all(out);
  return o;
}

std::string stage_name(int rank) { return "rank " + std::to_string(rank) + " (stage " + std::to_string(rank) + ")"; }

// Every rank exits on its own (none killed by the launcher's limit), each that
// lives with an error and the weights of the last good step.
void expect_clean_failure(const Outcome& o, bool faulty_dies, uint32_t seed, const std::string& where) {
  for (int r = 0; r < 2; ++r) {
    if (faulty_dies && r == faulty_rank(seed)) {
      EXPECT_EQ(o.exits[r].code, 9) << where << "\n" << o.logs;
      continue;
    }
    EXPECT_EQ(o.exits[r].code, 0) << where << ": rank " << r << "\n" << o.logs;
    EXPECT_THAT(o.errors[r], HasSubstr("conveyor: ")) << where << ": rank " << r << "\n" << o.logs;
    EXPECT_EQ(o.kept[r], "kept") << where << ": rank " << r << "\n" << o.logs;
  }
}

constexpr uint32_t kSeeds[] = {1, 2, 5, 6};  // both ranks, both schedules (1f1b, pipedream), different sends

// The receiving rank names the sender and what is wrong with its message.
void header_fault(const std::string& kind, const std::string& detail) {
  for (const uint32_t seed : kSeeds) {
    const std::string where = kind + " seed " + std::to_string(seed);
    const Outcome o = run_fault(kind, seed);
    expect_clean_failure(o, false, seed, where);
    const int sender = faulty_rank(seed), receiver = 1 - sender;
    EXPECT_THAT(o.errors[receiver], HasSubstr("from " + stage_name(sender) + " does not match what stage " +
                                              std::to_string(receiver) + " expects: "))
        << where << "\n" << o.logs;
    EXPECT_THAT(o.errors[receiver], HasSubstr(detail)) << where << "\n" << o.logs;
  }
}

TEST(WireFaults, AHeaderWithAWrongMagicIsRefused) {
  header_fault("magic", "its header is not a conveyor message for this channel and micro-batch");
}

TEST(WireFaults, AHeaderForAnotherChannelIsRefused) {
  header_fault("channel", "its header is not a conveyor message for this channel and micro-batch");
}

TEST(WireFaults, AHeaderForAnotherMicrobatchIsRefused) {
  header_fault("microbatch", "its header is not a conveyor message for this channel and micro-batch");
}

TEST(WireFaults, AHeaderWithAnotherDtypeIsRefused) { header_fault("dtype", "Float"); }

TEST(WireFaults, AHeaderWithAnotherShapeIsRefused) { header_fault("shape", "17]"); }

TEST(WireFaults, APeerThatDiesMidMessageStopsTheOtherWithinTheTimeout) {
  for (const uint32_t seed : kSeeds) {
    const std::string where = "die seed " + std::to_string(seed);
    const Outcome o = run_fault("die", seed);
    expect_clean_failure(o, true, seed, where);
    const int survivor = 1 - faulty_rank(seed);
    EXPECT_THAT(o.errors[survivor], AnyOf(HasSubstr("has probably exited"), HasSubstr("timed out after 1000 ms")))
        << where << "\n" << o.logs;
    EXPECT_THAT(o.errors[survivor], HasSubstr(stage_name(faulty_rank(seed)))) << where << "\n" << o.logs;
  }
}

TEST(WireFaults, APeerThatStallsPastTheTimeoutIsGivenUpOn) {
  for (const uint32_t seed : {1u, 6u}) {
    const std::string where = "stall seed " + std::to_string(seed);
    const Outcome o = run_fault("stall", seed);
    expect_clean_failure(o, false, seed, where);
    const int waiter = 1 - faulty_rank(seed);
    EXPECT_THAT(o.errors[waiter], HasSubstr("timed out after 1000 ms waiting for the")) << where << "\n" << o.logs;
    EXPECT_THAT(o.errors[waiter], HasSubstr("from " + stage_name(faulty_rank(seed)))) << where << "\n" << o.logs;
  }
}

TEST(WireFaults, APeerThatClosesItsConnectionsStopsBothRanks) {
  for (const uint32_t seed : kSeeds) {
    const std::string where = "close seed " + std::to_string(seed);
    const Outcome o = run_fault("close", seed);
    expect_clean_failure(o, false, seed, where);
    const int other = 1 - faulty_rank(seed);
    EXPECT_THAT(o.errors[other], AnyOf(HasSubstr("has probably exited"), HasSubstr("Connection closed by peer"),
                                       HasSubstr("timed out after 1000 ms")))
        << where << "\n" << o.logs;
    EXPECT_THAT(o.errors[other], HasSubstr(stage_name(faulty_rank(seed)))) << where << "\n" << o.logs;
  }
}

// A write to a connection the peer closed, in a child that starts with
// SIGPIPE's default action and calls ignore_broken_pipes() first or not.
// Returns the child's wait status.
int write_to_a_closed_peer(bool ignore_first) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    if (ignore_first && !ignore_broken_pipes()) ::_exit(3);
    int ends[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, ends) != 0) ::_exit(4);
    ::close(ends[1]);
    const char byte = 0;
    const bool epipe = ::write(ends[0], &byte, 1) < 0 && errno == EPIPE;
    ::_exit(epipe ? 0 : 5);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

// The rank whose peer closed its sockets was once killed by SIGPIPE when Gloo
// wrote to it (exit 141 in the test above, now and then), instead of failing
// with an error that names the peer: the store and the groups now make a
// closed socket an error (EPIPE), unless the program chose SIGPIPE's action.
TEST(WireFaults, APeersClosedSocketIsAnErrorNotASilentDeath) {
  const int without = write_to_a_closed_peer(false);
  EXPECT_TRUE(WIFSIGNALED(without) && WTERMSIG(without) == SIGPIPE) << "status " << without;
  const int with = write_to_a_closed_peer(true);
  EXPECT_TRUE(WIFEXITED(with) && WEXITSTATUS(with) == 0) << "status " << with;
  struct sigaction saved {};
  ::sigaction(SIGPIPE, nullptr, &saved);
  ::signal(SIGPIPE, +[](int) {});
  EXPECT_FALSE(ignore_broken_pipes());  // a handler the program chose stays
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  EXPECT_NE(now.sa_handler, SIG_IGN);
  EXPECT_NE(now.sa_handler, SIG_DFL);
  ::sigaction(SIGPIPE, &saved, nullptr);
}

}  // namespace
}  // namespace conveyor::testing

int main(int argc, char** argv) {
  if (const char* role = std::getenv("CONVEYOR_TEST_ROLE")) {
    return std::string(role) == "wire" ? conveyor::testing::run_rank(conveyor::testing::wire_fault) : 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
