// A checkpoint write cut short at any byte (a full disk, a crash) leaves the
// previous checkpoint as it was, loadable and bit-identical; and a checkpoint
// file damaged afterwards (cut, or one bit flipped) is refused with a clear
// error and changes nothing in the pipeline it was loaded into, or, where the
// damage missed the content (zip bookkeeping), loads that very content.
#include "error_of.h"
#include "fault_plans.h"
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "temp_dir.h"
#include "test_models.h"
#include "tests/fuzz/checkpoint_fixture.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace conveyor::testing {
namespace {

using ::testing::AnyOf;
using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::unique_ptr<StageRunner> pipedream(uint64_t seed) {
  torch::manual_seed(seed);
  return std::make_unique<StageRunner>(
      make_mlp(), PipelineOptions().workers(2).microbatches(2).schedule("pipedream").optimizer([](auto p) {
        return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01));
      }));
}

void train_steps(StageRunner& pipe, int steps) {
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(50 + step);
    pipe.train_step(torch::randn({4, 8}, torch::kFloat64), torch::randn({4, 3}, torch::kFloat64), mse);
  }
}

// What a checkpoint restores into a pipeline: its weights, and its stages'
// optimizer state as the next step shows it (a step from the same state
// gives the same weights).
std::vector<at::Tensor> weights_of(const StageRunner& pipe) {
  std::vector<at::Tensor> out;
  for (const auto& p : pipe.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

// Fails every write_atomically after `limit` bytes.
struct ShortWrites : FaultInjector {
  int64_t limit = -1;
  int64_t write_limit(const std::string&) override { return limit; }
};

class CheckpointDurability : public ::testing::Test {
 protected:
  void SetUp() override {
    // The previous checkpoint (after 2 steps) and the one being written (after 3).
    auto pipe = pipedream(0);
    train_steps(*pipe, 2);
    previous_ = dir_.str() + "/run.ckpt";
    save_checkpoint(previous_, *pipe, {2, {}});
    previous_bytes_ = read_bytes(previous_);
    previous_weights_ = weights_of(*pipe);
    train_steps(*pipe, 1);
    previous_next_ = weights_after_loading(previous_);
    writer_ = std::move(pipe);
    save_checkpoint(dir_.str() + "/next.ckpt", *writer_, {3, {}});
    next_bytes_ = read_bytes(dir_.str() + "/next.ckpt");
    fs::remove(dir_.str() + "/next.ckpt");
  }

  // The weights a fresh pipeline has after loading `path` and one more step.
  std::vector<at::Tensor> weights_after_loading(const std::string& path) {
    auto fresh = pipedream(7);
    load_checkpoint(path, *fresh);
    train_steps(*fresh, 1);
    return weights_of(*fresh);
  }

  // Loads `path` into a pipeline in another state: either it is refused with
  // a clear error and that pipeline is unchanged, or it loads exactly the
  // previous checkpoint. Returns whether it was refused.
  bool refused_or_exact(const std::string& path, const std::string& where) {
    auto target = pipedream(9);
    train_steps(*target, 1);
    const std::vector<at::Tensor> before = weights_of(*target);
    const int64_t steps_before = target->completed_steps();
    try {
      load_checkpoint(path, *target);
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), AnyOf(HasSubstr("is not a readable checkpoint (truncated or not one)"),
                                  HasSubstr("is damaged: its content does not match the digest"),
                                  HasSubstr("is damaged: it has lost the digest"),
                                  HasSubstr("is not a conveyor checkpoint")))
          << where;
      EXPECT_TRUE(same(weights_of(*target), before)) << where << ": a refused load changed the weights";
      EXPECT_EQ(target->completed_steps(), steps_before) << where;
      return true;
    }
    EXPECT_TRUE(same(weights_of(*target), previous_weights_)) << where << ": loaded other weights";
    return false;
  }

  examples::TempDir dir_;
  std::string previous_;
  std::vector<char> previous_bytes_, next_bytes_;
  std::vector<at::Tensor> previous_weights_, previous_next_;
  std::unique_ptr<StageRunner> writer_;
};

TEST_F(CheckpointDurability, AWriteCutAfterAnyNumberOfBytesLeavesThePreviousCheckpoint) {
  ShortWrites faults;
  FaultInjectionScope scope(faults);
  const int64_t size = static_cast<int64_t>(next_bytes_.size());
  std::vector<int64_t> cuts;
  for (int64_t n = 0; n < 64; ++n) cuts.push_back(n);  // the zip's first header
  for (int64_t i = 0; i < 96; ++i) cuts.push_back(64 + (size - 65) * i / 95);  // across the file, to its last byte
  for (const int64_t n : cuts) {
    const std::string where = "write cut after " + std::to_string(n) + " of " + std::to_string(size) + " bytes";
    faults.limit = n;
    try {
      save_checkpoint(previous_, *writer_, {3, {}});
      ADD_FAILURE() << where << ": the save did not fail";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("conveyor: saving " + previous_ + " failed, nothing was written: cannot write "))
          << where;
      EXPECT_THAT(e.what(), HasSubstr("No space left on device")) << where;
    }
    ASSERT_EQ(read_bytes(previous_), previous_bytes_) << where;
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path()), fs::directory_iterator()), 1)
        << where << ": a temporary was left";
  }
  faults.limit = -1;
  EXPECT_TRUE(same(weights_after_loading(previous_), previous_next_)) << "the previous checkpoint after the cuts";
  // Without the fault the same save goes through.
  save_checkpoint(previous_, *writer_, {3, {}});
  EXPECT_EQ(read_bytes(previous_), next_bytes_);
}

// What a crash part-way leaves in the temporary: any prefix of a checkpoint.
TEST_F(CheckpointDurability, AnyPrefixOfACheckpointIsRefused) {
  const std::string cut = dir_.str() + "/cut.ckpt";
  const size_t size = previous_bytes_.size();
  int tried = 0;
  for (size_t n = 0; n < size; n += std::max<size_t>(1, size / 400)) {
    write_bytes(cut, std::vector<char>(previous_bytes_.begin(), previous_bytes_.begin() + n));
    EXPECT_TRUE(refused_or_exact(cut, "the first " + std::to_string(n) + " of " + std::to_string(size) + " bytes"));
    ++tried;
  }
  EXPECT_GE(tried, 400);
}

TEST_F(CheckpointDurability, AFlippedBitIsRefusedOrMissesTheContent) {
  const std::string flipped = dir_.str() + "/flipped.ckpt";
  const size_t size = previous_bytes_.size();
  int refused = 0, tried = 0;
  for (size_t at = 0; at < size; at += std::max<size_t>(1, size / 300)) {
    std::vector<char> bytes = previous_bytes_;
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (at % 8)));
    write_bytes(flipped, bytes);
    refused += refused_or_exact(flipped, "bit " + std::to_string(at % 8) + " of byte " + std::to_string(at)) ? 1 : 0;
    ++tried;
  }
  // Most of the file is content (the weights, the optimizer's moments, the
  // pickle): most flips must be refused.
  EXPECT_GE(tried, 300);
  EXPECT_GE(refused, tried / 2) << refused << " of " << tried << " flips refused";
  RecordProperty("flips_refused", refused);
  RecordProperty("flips_tried", tried);
}

// The checkpoint fuzzer's find (tests/fuzz/corpus/checkpoint/regression-crash-
// tensor-outsizes-its-record.ckpt, a format-2 file, so without a digest): an
// optimizer state whose pickle declares 2^30 elements and a row stride of
// 2^27 over a record of 48 bytes. LibTorch's unpickler sized the storage by
// the declaration, so the bounds check passed and copying the tensor read
// far past the record (SEGV); storages are now the records' own bytes, which
// LibTorch then checks the tensor against.
TEST(CheckpointDamage, ATensorThatReachesPastItsRecordIsRefused) {
  torch::nn::Sequential model = fuzzing::fixture_model();
  StageRunner pipe(model, PipelineOptions().workers(2).microbatches(2).boundaries({fuzzing::kSplit}));
  auto adam = fuzzing::caller_adam(pipe.parameters());
  const std::vector<at::Tensor> before = weights_of(pipe);
  const std::string file =
      std::string(CONVEYOR_FUZZ_CORPUS_DIR) + "/checkpoint/regression-crash-tensor-outsizes-its-record.ckpt";
  try {
    load_checkpoint(file, pipe, {adam.get()});
    ADD_FAILURE() << "a tensor reaching past its record was loaded";
  } catch (const std::invalid_argument& e) {
    // LibTorch's own check (2.13 on), or before it ours (torch 2.11 unpickles
    // the tensor without checking it against the storage).
    EXPECT_THAT(e.what(),
                ::testing::AnyOf(
                    AllOf(HasSubstr("is not a readable checkpoint"),
                          HasSubstr("require a storage of at least 1073741840 bytes, but storage only has 48 bytes")),
                    AllOf(HasSubstr("is damaged"),
                          HasSubstr("'exp_avg' of shape [3, 4] reaches past the end of its storage (48 bytes)"))));
  }
  EXPECT_TRUE(same(weights_of(pipe), before));
  EXPECT_TRUE(adam->state().empty());
}

// The fuzzer's next find (regression-oom-record-size-read-while-opening.ckpt):
// a record whose central-directory entry says "deflated, 2.9 GB" made
// LibTorch's reader allocate that much while opening the file, before any
// check of ours could run. Sizes are now read from the directory first.
TEST(CheckpointDamage, ARecordSizeOutsizingTheFileIsRefusedBeforeTheFileIsOpened) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("format", "conveyor-checkpoint");
  d.insert("weights", torch::arange(12, torch::kFloat32));
  const std::vector<char> good = checkpoint_bytes(d);
  ASSERT_TRUE(zip_records_fit(good));
  // The central directory's entries, found by their signature.
  std::vector<size_t> entries;
  for (size_t at = 0; at + 4 <= good.size(); ++at) {
    if (std::memcmp(good.data() + at, "PK\x01\x02", 4) == 0) entries.push_back(at);
  }
  ASSERT_GE(entries.size(), 3u);
  const auto put = [](std::vector<char>& bytes, size_t at, uint64_t value, int n) {
    for (int i = 0; i < n; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  };
  for (size_t entry : entries) {
    std::vector<char> deflated = good;
    put(deflated, entry + 10, 8, 2);            // method: deflate, which miniz lets differ in size
    put(deflated, entry + 24, 0xb0000028, 4);   // uncompressed size: 2.9 GB
    EXPECT_FALSE(zip_records_fit(deflated)) << "entry at " << entry;
    std::vector<char> zip64 = good;
    put(zip64, entry + 24, 0xffffffff, 4);      // "in the ZIP64 field", where there is none
    EXPECT_FALSE(zip_records_fit(zip64)) << "entry at " << entry;
  }
  examples::TempDir dir;
  const std::string file = dir.str() + "/oom.ckpt";
  std::vector<char> bad = good;
  put(bad, entries[0] + 10, 8, 2);
  put(bad, entries[0] + 24, 0xb0000028, 4);
  write_bytes(file, bad);
  StageRunner pipe(make_mlp(), PipelineOptions().workers(2).microbatches(2));
  EXPECT_THAT(error_of([&] { load_checkpoint(file, pipe); }), HasSubstr("is not a readable checkpoint"));
  const std::string regression =
      std::string(CONVEYOR_FUZZ_CORPUS_DIR) + "/checkpoint/regression-oom-record-size-read-while-opening.ckpt";
  EXPECT_FALSE(zip_records_fit(read_bytes(regression)));
}

}  // namespace
}  // namespace conveyor::testing
