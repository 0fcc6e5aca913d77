// The multi-process helpers that run in one process: the measured c10d
// link, a replica's shard, the hybrid layout, atomic writes.

#include "distributed_roles.h"
#include "error_of.h"
#include "plugin/measure/c10d_link.h"
#include "plugin/support/atomic_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string helper_scratch(const std::string& name) {
  return (fs::temp_directory_path() / ("conveyor-helpers-" + std::to_string(::getpid()) + "-" + name)).string();
}

// The planner's link for a multi-process pipeline is measured: a header and a
// payload per transfer between two ranks on this machine, through shared
// memory as the transport passes them by default, or over Gloo's sockets.
TEST(DistributedHelpers, TheC10dLinkIsMeasured) {
  for (const bool shared_memory : {true, false}) {
    const LinkProfile link = shared_memory ? measure_c10d_link(8 << 20, 3)
                                           : measure_c10d_link(8 << 20, 3, std::chrono::seconds(30), false);
    EXPECT_THAT(link.kind, HasSubstr(shared_memory ? "through shared memory" : "c10d Gloo"));
    EXPECT_GT(link.latency_seconds, 0);
    EXPECT_LT(link.latency_seconds, 1.0);
    // Sending and receiving take the processes' processor time too.
    EXPECT_GT(link.cpu_seconds_per_transfer, 0);
    EXPECT_LT(link.cpu_seconds_per_transfer, 1.0);
    EXPECT_GE(link.cpu_seconds_per_byte, 0);
    EXPECT_GT(link.cpu_seconds(64 << 20), link.cpu_seconds_per_transfer * (1 - 1e-12));
    // On a busy machine the wake-ups can hide the bytes' cost (0: not measurable).
    EXPECT_GE(link.bytes_per_second, 0);
    EXPECT_GE(link.seconds(64 << 20), link.seconds(1 << 10));
  }
  EXPECT_THAT(testing::error_of([] { measure_c10d_link(16, 1); }), HasSubstr("at least 1 KiB"));
}

TEST(DistributedHelpers, ShardGivesEachReplicaItsSliceAndRejectsUnevenBatches) {
  const at::Tensor batch = torch::arange(12).reshape({6, 2});
  EXPECT_TRUE(shard(batch, 1, 3).equal(batch.narrow(0, 2, 2)));
  EXPECT_TRUE(shard(batch, 0, 2, 1).equal(batch.narrow(1, 0, 1)));
  EXPECT_THAT([&] { shard(batch, 0, 4); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("a global batch of 6 samples (dimension 0 of shape [6, 2]) does not split "
                            "evenly among 4 replicas")));
  EXPECT_THAT([&] { shard(batch, 0, 2, 2); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("no dimension 2")));
}

TEST(DistributedHelpers, LayoutPutsAReplicasStagesOnConsecutiveRanks) {
  const HybridLayout layout = HybridLayout::for_world(6, 3);
  EXPECT_EQ(layout.replicas, 2);
  EXPECT_EQ(layout.pipeline_ranks(1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(layout.replica_ranks(2), (std::vector<int>{2, 5}));
  EXPECT_EQ(layout.worker_of(4), 1);
  EXPECT_EQ(layout.replica_of(4), 1);
  EXPECT_THAT([] { HybridLayout::for_world(6, 4); }, ::testing::ThrowsMessage<std::invalid_argument>(
                                                         HasSubstr("the number of workers must divide WORLD_SIZE")));
}

TEST(DistributedHelpers, WriteAtomicallyLeavesTheOldFileWhenWritingFails) {
  const std::string dir = helper_scratch("save");
  fs::create_directories(dir);
  const std::string path = dir + "/model.pt";
  write_atomically(path, [](std::ostream& out) { out << "first"; });
  EXPECT_THROW(write_atomically(path,
                                [](std::ostream& out) {
                                  out << "half of the second";
                                  throw std::runtime_error("disk full");
                                }),
               std::runtime_error);
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), "first");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // no temporary left
  fs::remove_all(dir);
}

}  // namespace
}  // namespace conveyor::testing
