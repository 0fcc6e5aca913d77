// Writes the checkpoint fuzzer's seed corpus (tests/fuzz/corpus/checkpoint/)
// into the folder given: real checkpoints of checkpoint_fixture.h's pipeline
// in its three set-ups (saved by save_checkpoint after a training step), one of
// another model, truncated and corrupted copies, and copies in format version
// 2, which has no digest: a mutated file with a digest is refused by it, so
// only those reach the loader's checks of the content.
//   make_checkpoint_seeds tests/fuzz/corpus/checkpoint
#include "plugin/checkpoint/checkpoint.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "tests/fuzz/checkpoint_fixture.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

using conveyor::fuzzing::Setup;

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return (out - target).pow(2).mean(); }

std::vector<char> read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Saves the fixture after one training step; `wide` makes the last layer wider (another model).
void save(const std::string& path, Setup setup, bool wide = false) {
  torch::nn::Sequential model = conveyor::fuzzing::fixture_model();
  if (wide) {
    model = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::ReLU(),
                                  torch::nn::Linear(3, 5));
  }
  auto options = conveyor::PipelineOptions().workers(2).microbatches(2).boundaries({conveyor::fuzzing::kSplit});
  if (setup == Setup::kOwn) options.schedule("pipedream").optimizer(conveyor::fuzzing::stage_sgd).stage_rng(true);
  if (setup == Setup::kOwnSync) options.schedule("1f1b").optimizer(conveyor::fuzzing::stage_sgd);
  conveyor::StageRunner pipe(model, options);
  const at::Tensor x = torch::randn({8, 4});
  const at::Tensor y = torch::randn({8, wide ? 5 : 2});
  if (setup == Setup::kCaller) {
    auto adam = conveyor::fuzzing::caller_adam(pipe.parameters());
    adam->zero_grad();
    pipe.train_step(x, y, mse);
    adam->step();
    conveyor::save_checkpoint(path, pipe, {1, {adam.get()}});
  } else {
    pipe.train_step(x, y, mse);
    conveyor::save_checkpoint(path, pipe, {1, {}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_checkpoint_seeds FOLDER\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::filesystem::create_directories(dir);
  save(dir + "/caller_adam.ckpt", Setup::kCaller);
  save(dir + "/own_sgd_stage_rng.ckpt", Setup::kOwn);
  save(dir + "/own_sgd.ckpt", Setup::kOwnSync);  // reshards into three stages
  save(dir + "/other_model.ckpt", Setup::kCaller, /*wide=*/true);
  for (const char* name : {"caller_adam", "own_sgd_stage_rng", "own_sgd"}) {
    const std::vector<char> bytes = read(dir + "/" + name + ".ckpt");
    write(dir + "/" + name + "-truncated.ckpt", std::vector<char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
    std::vector<char> flipped = bytes;  // bytes of the pickle and of the tensors' data
    for (size_t i = 64; i < flipped.size(); i += flipped.size() / 7) flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    write(dir + "/" + name + "-corrupted.ckpt", flipped);
    c10::impl::GenericDict d = torch::pickle_load(bytes).toGenericDict();
    d.insert_or_assign("version", int64_t{2});
    write(dir + "/" + name + "-v2.ckpt", torch::pickle_save(d));
  }
  std::printf("make_checkpoint_seeds: wrote the seeds into %s\n", dir.c_str());
  return 0;
}
