// The c10d transport with its shared-memory links (C10dTransportOptions::
// shared_memory): processes on one machine pass activations and gradients
// through rings in shared memory. The binary starts copies of itself as the
// ranks (rank_launcher.h); each writes what it computed and the tests compare
// it with the single-process runtime, bit for bit (within 1e-10), as the
// Gloo-only tests do; then the failures a socket would report: a peer that
// exits, one that stalls.

#include "distributed/faulty_peer_check.h"
#include "distributed/training_options_check.h"
#include "distributed_roles.h"
#include "distributed_tensor_roles.h"
#include "rank_launcher.h"

#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A boundary of 1536 float64 values a sample: 24 KiB a micro-batch of 2
// samples, so that GPipe's four forwards (96 KiB) overfill a 64 KiB ring and
// its sender waits for room, and the ring wraps.
constexpr int64_t kRingWidth = 1536;
constexpr int64_t kSmallRing = int64_t{64} << 10;

PipelineOptions gpipe() { return PipelineOptions().workers(2).microbatches(kMicrobatches).schedule("gpipe"); }

// A pipeline built with the default options, then one with shared memory
// off: how many links each made ("default off").
void default_links(Worker& w) {
  auto groups = w.groups("shm-default", 2, std::chrono::seconds(20));
  std::string made;
  for (const DistributedOptions& o : {DistributedOptions(), DistributedOptions{.shared_memory = false}}) {
    DistributedRunner pipe(seeded_mlp(), PipelineOptions(gpipe()).distributed(o), groups);
    const Data d = global_batch(0);
    pipe.train_step(d.x, d.y, mse);
    made += (made.empty() ? "" : " ") + std::to_string(pipe.shared_memory_links());
  }
  w.note("links", made);
  groups->barrier();
}

// Over a transport made here, to read its counts: "messages wire shared links".
void counted(Worker& w) {
  auto groups = w.groups("shm-counts", 2, std::chrono::seconds(20));
  const auto run = [&](const std::string& what, int64_t width, int64_t ring, const PipelineOptions& options) {
    C10dTransportOptions o;
    o.worker = groups->worker();
    o.ranks = {0, 1};
    o.timeout = std::chrono::seconds(20);
    o.shared_memory = true;
    o.shared_memory_bytes = ring;
    auto transport = std::make_unique<C10dTransport>(groups->pipeline(), nullptr, o);
    const C10dTransport& wire = *transport;
    StageRunner pipe(seeded_wide(width), options, o.worker, std::move(transport));
    for (int step = 0; step < kSteps; ++step) {
      const Data s = global_batch(step);
      pipe.train_step(s.x, s.y, mse);
    }
    write_tensors(w.file(what), grads_of(pipe.named_parameters()));
    const auto c = wire.counts();
    w.note(what, c10::str(c.messages, " ", c.wire_messages, " ", c.shared_memory_messages, " ",
                          wire.shared_memory_links()));
  };
  const PipelineOptions one_f_one_b = PipelineOptions().workers(2).microbatches(kMicrobatches);
  run("narrow", 16, int64_t{8} << 20, one_f_one_b);
  run("wide", 70000, int64_t{8} << 20, one_f_one_b);
  run("ring", kRingWidth, kSmallRing, gpipe());
  groups->barrier();
}

std::string scratch(const std::string& name) {
  return (fs::temp_directory_path() / ("conveyor-shm-" + std::to_string(::getpid()) + "-" + name)).string();
}

TensorMap merged(const std::string& out, const std::string& what, int world) {
  TensorMap all;
  for (int r = 0; r < world; ++r) {
    for (auto& [name, t] : read_tensors(out + "/" + what + "-rank" + std::to_string(r) + ".pt")) all[name] = t;
  }
  return all;
}

TensorMap in_process(const torch::nn::Sequential& model, const PipelineOptions& options, int steps) {
  StageRunner pipe(model, options);
  TensorMap grads;
  for (int step = 0; step < steps; ++step) {
    const Data d = global_batch(steps == 1 ? 0 : step);
    const StepResult r = pipe.train_step(d.x, d.y, mse);
    grads = grads_of(pipe.named_parameters());
    if (steps == 1) grads["loss"] = at::full({1}, r.loss, at::kDouble);
  }
  return grads;
}

class SharedMemoryJob : public ::testing::TestWithParam<int> {};

TEST_P(SharedMemoryJob, EverySynchronousScheduleEqualsTheInProcessRuntime) {
  const int world = GetParam();
  const std::string out = scratch("exact" + std::to_string(world));
  // The roles of test_distributed, over shared memory.
  const auto exits = launch("pipelines", world, out, {{"CONVEYOR_TEST_SHARED_MEMORY", "1"}});
  for (const auto& e : exits) ASSERT_EQ(e.code, 0) << logs(exits);
  std::vector<std::string> cases = synchronous_cases();
  if (world == 2) cases.insert(cases.end(), virtual_stage_cases().begin(), virtual_stage_cases().end());
  for (const std::string& schedule : cases) {
    expect_equal(merged(out, schedule, world), in_process(seeded_mlp(), synchronous_case(schedule).workers(world), 1),
                 schedule + " K=" + std::to_string(world));
  }
  StageRunner pipedream(
      seeded_mlp(),
      PipelineOptions().workers(world).microbatches(kMicrobatches).schedule("pipedream").optimizer(sgd_momentum()));
  for (int step = 0; step < kSteps; ++step) {
    const Data s = global_batch(step);
    pipedream.train_step(s.x, s.y, mse);
  }
  expect_equal(merged(out, "pipedream", world), values_of(pipedream.named_parameters()), "pipedream");
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedMemoryJob, ::testing::Values(2, 3));

// Each micro-batch's message goes through the ring (a payload past 1 MiB on
// its own Gloo tag, as without shared memory); a ring smaller than a step's
// messages fills and wraps, and the gradients stay exact.
TEST(SharedMemoryLinks, MessagesTakeTheRingAndARingThatFillsWaitsForRoom) {
  const std::string out = scratch("counts");
  const auto exits = launch("shm-counts", 2, out);
  for (const auto& e : exits) ASSERT_EQ(e.code, 0) << logs(exits);
  const auto counts = [&](const std::string& what, int rank) {
    std::ifstream in(out + "/" + what + "-rank" + std::to_string(rank) + ".txt");
    std::vector<int64_t> c(4, -1);
    for (auto& v : c) in >> v;
    return c;
  };
  const int64_t sent = int64_t{kMicrobatches} * kSteps;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(counts("narrow", r), (std::vector<int64_t>{sent, sent, sent, 2})) << r;
    EXPECT_EQ(counts("wide", r), (std::vector<int64_t>{sent, 2 * sent, sent, 2})) << r;
    EXPECT_EQ(counts("ring", r), (std::vector<int64_t>{sent, sent, sent, 2})) << r;
  }
  const auto one_f_one_b = PipelineOptions().workers(2).microbatches(kMicrobatches);
  const std::vector<std::tuple<std::string, int64_t, PipelineOptions>> runs = {
      {"narrow", 16, one_f_one_b}, {"wide", 70000, one_f_one_b}, {"ring", kRingWidth, gpipe()}};
  for (const auto& [what, width, options] : runs) {
    expect_equal(merged(out, what, 2), in_process(seeded_wide(width), options, kSteps), what);
  }
  fs::remove_all(out);
}

// Neighbouring processes of one machine use shared memory unless told not
// to: a link each way between the two workers by default, none when off.
TEST(SharedMemoryLinks, AreTheDefaultBetweenProcessesOfOneMachine) {
  const std::string out = scratch("default");
  const auto exits = launch("shm-default", 2, out);
  for (const auto& e : exits) ASSERT_EQ(e.code, 0) << logs(exits);
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(out + "/links-rank" + std::to_string(r) + ".txt");
    std::string made;
    std::getline(in, made);
    EXPECT_EQ(made, "2 0") << "rank " << r;
  }
  fs::remove_all(out);
}

// A peer that exits mid-step: its neighbours notice within the link's poll
// (50 ms), long before the 5 s timeout, and name it and what they waited for.
TEST(SharedMemoryFaults, ADeadPeerIsNoticedAtOnce) {
  const std::string out = scratch("dead");
  const auto exits = launch("faulty", 3, out,
                            {{"CONVEYOR_TEST_TRIP", "exit:3"},
                             {"CONVEYOR_TEST_TRIP_RANK", "1"},
                             {"CONVEYOR_TEST_TIMEOUT_MS", "5000"},
                             {"CONVEYOR_TEST_SHARED_MEMORY", "1"}});
  fs::remove_all(out);
  expect_dead_peer_noticed(exits, 5000);
  for (int r : {0, 2}) EXPECT_THAT(exits[r].log, HasSubstr("worker 1's process (pid ")) << logs(exits);
}

// A peer that stalls: the wait ends at the timeout, as a Gloo one does.
TEST(SharedMemoryFaults, AStalledPeerTimesOut) {
  const std::string out = scratch("stall");
  const auto exits = launch("faulty", 3, out,
                            {{"CONVEYOR_TEST_TRIP", "stall:2"},
                             {"CONVEYOR_TEST_TRIP_RANK", "1"},
                             {"CONVEYOR_TEST_TIMEOUT_MS", "1000"},
                             {"CONVEYOR_TEST_SHARED_MEMORY", "1"}});
  fs::remove_all(out);
  expect_stalled_peer_timed_out(exits);
}

}  // namespace
}  // namespace conveyor::testing

int main(int argc, char** argv) {
  if (const char* role = std::getenv("CONVEYOR_TEST_ROLE")) {
    const std::map<std::string, void (*)(conveyor::testing::Worker&)> roles = {
        {"pipelines", conveyor::testing::pipelines},
        {"shm-counts", conveyor::testing::counted},
        {"shm-default", conveyor::testing::default_links},
        {"faulty", conveyor::testing::faulty}};
    const auto it = roles.find(role);
    return it == roles.end() ? 2 : conveyor::testing::run_rank(it->second);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
