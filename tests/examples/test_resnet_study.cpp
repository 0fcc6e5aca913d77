// The ResNet study's pieces: the block-wise ResNet and its stage boundaries,
// and the image readers (scikit-learn digits through gzip, CIFAR-10 binary).

#include "error_of.h"
#include "examples/common/digits_data.h"
#include "examples/common/resnet.h"
#include "plugin/conveyor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

namespace conveyor::examples {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh directory under the system's temporary one, removed at the end.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("conveyor_resnet_study_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

using testing::error_of;

// `rows` digits lines: pixel i of row r is (r + i) % 17, the label r % 10.
std::string digits_csv(int rows) {
  std::string text;
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < 64; ++i) text += std::to_string((r + i) % 17) + ",";
    text += std::to_string(r % 10) + "\n";
  }
  return text;
}

void write_file(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(ResNet, Resnet20HasStemNineBlocksAndHead) {
  const ResNetConfig c{.depth = 20, .width = 4, .in_channels = 1, .image_size = 16, .num_classes = 10};
  auto net = make_resnet(c);
  ASSERT_EQ(net->size(), 11u);
  EXPECT_EQ(resnet_num_elements(c), 11);
  EXPECT_NE(net[0]->as<StemImpl>(), nullptr);
  EXPECT_NE(net[10]->as<HeadImpl>(), nullptr);
  std::vector<int> projected;
  for (int i = 1; i <= 9; ++i) {
    const auto* block = net[i]->as<BasicBlockImpl>();
    ASSERT_NE(block, nullptr) << "element " << i;
    if (!block->project.is_empty()) projected.push_back(i);
  }
  EXPECT_THAT(projected, ElementsAre(4, 7));  // the first blocks of groups 2 and 3 change the shape
  const auto names = resnet_elements(c);
  EXPECT_EQ(names[5].name, "block2.2(8->8)");
  EXPECT_EQ(net->forward(torch::randn({3, 1, 16, 16})).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(ResNet, RejectsADepthThatIsNot6nPlus2) {
  EXPECT_THAT(error_of([] { make_resnet({.depth = 21}); }), HasSubstr("6n+2"));
  EXPECT_THAT(error_of([] { make_resnet({.depth = 20, .width = 0}); }), HasSubstr("width"));
}

TEST(ResNet, BoundariesPutWholeElementsOnStagesEvenly) {
  const ResNetConfig c{.depth = 20, .width = 8, .in_channels = 1, .image_size = 16};
  EXPECT_TRUE(resnet_boundaries(c, 1).empty());
  std::vector<int64_t> each(10);
  std::iota(each.begin(), each.end(), 1);
  EXPECT_EQ(resnet_boundaries(c, 11), each);
  // The nine blocks cost about the same, the stem and head little: two
  // stages split after the fourth or fifth block.
  const auto two = resnet_boundaries(c, 2);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_TRUE(two[0] == 5 || two[0] == 6) << two[0];
  EXPECT_THAT(error_of([&] { resnet_boundaries(c, 12); }), HasSubstr("11 elements"));
}

TEST(ResNet, FourStagePipelineComputesTheUnsplitOutput) {
  const ResNetConfig c{.depth = 14, .width = 4, .in_channels = 1, .image_size = 8};
  torch::manual_seed(3);
  auto net = make_resnet(c);
  net->eval();
  const at::Tensor x = torch::randn({6, 1, 8, 8});
  const at::Tensor expected = net->forward(x);
  StageRunner pipe(net, PipelineOptions().workers(4).microbatches(3).boundaries(resnet_boundaries(c, 4)));
  pipe.eval();
  EXPECT_TRUE(torch::allclose(pipe.forward(x), expected, 1e-5, 1e-6));
}

TEST(Digits, ReadsGzippedCsvSplitsAndNormalises) {
  TempDir dir;
  write_file(dir / "d.csv", digits_csv(20));
  ASSERT_EQ(std::system(("gzip -kf '" + (dir / "d.csv").string() + "'").c_str()), 0);
  const ImageData d = load_digits((dir / "d.csv.gz").string(), 16, 15, 7);
  EXPECT_EQ(d.train.images.sizes(), (std::vector<int64_t>{15, 1, 16, 16}));
  EXPECT_EQ(d.test.images.sizes(), (std::vector<int64_t>{5, 1, 16, 16}));
  EXPECT_NEAR(d.train.images.mean().item<double>(), 0.0, 1e-5);
  EXPECT_NEAR(d.train.images.std(/*unbiased=*/false).item<double>(), 1.0, 1e-4);
  std::multiset<int64_t> labels;
  for (const auto& set : {d.train.labels, d.test.labels}) {
    for (int64_t i = 0; i < set.size(0); ++i) labels.insert(set[i].item<int64_t>());
  }
  EXPECT_EQ(labels, (std::multiset<int64_t>{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9}));
  // The plain file reads the same, and the same seed gives the same split.
  const ImageData plain = load_digits((dir / "d.csv").string(), 16, 15, 7);
  EXPECT_TRUE(torch::equal(plain.test.images, d.test.images));
  EXPECT_TRUE(torch::equal(plain.test.labels, d.test.labels));
}

TEST(Digits, KeepsPixelsAt8x8) {
  TempDir dir;
  write_file(dir / "d.csv", digits_csv(4));
  const ImageData d = load_digits((dir / "d.csv").string(), 8, 3, 1);
  // Normalisation is affine per channel: pixel order within an image survives.
  const at::Tensor img = d.train.images[0].flatten();
  const int64_t row = d.train.labels[0].item<int64_t>();
  for (int i = 0; i + 1 < 64; ++i) {
    const bool up = (row + i + 1) % 17 > (row + i) % 17;
    EXPECT_EQ(img[i + 1].item<float>() > img[i].item<float>(), up) << "pixel " << i;
  }
}

TEST(Digits, ErrorsNameTheCause) {
  TempDir dir;
  EXPECT_THAT(error_of([&] { load_digits((dir / "none.csv.gz").string(), 16, 10, 1); }), HasSubstr("no such file"));
  write_file(dir / "bad.csv.gz", "not gzip");
  EXPECT_THAT(error_of([&] { load_digits((dir / "bad.csv.gz").string(), 16, 10, 1); }), HasSubstr("gzip -dc"));
  write_file(dir / "short.csv", digits_csv(2) + "1,2,3\n");
  EXPECT_THAT(error_of([&] { load_digits((dir / "short.csv").string(), 16, 1, 1); }), HasSubstr("line 3"));
  write_file(dir / "pixel.csv", "17," + digits_csv(1).substr(2));
  EXPECT_THAT(error_of([&] { load_digits((dir / "pixel.csv").string(), 16, 1, 1); }), HasSubstr("outside 0..16"));
  write_file(dir / "ok.csv", digits_csv(5));
  EXPECT_THAT(error_of([&] { load_digits((dir / "ok.csv").string(), 16, 5, 1); }), HasSubstr("1..4 of the 5"));
}

TEST(Digits, FindsTheFileInAVirtualEnvironment) {
  TempDir dir;
  const fs::path data = dir / "lib/python3.11/site-packages/sklearn/datasets/data";
  fs::create_directories(data);
  EXPECT_EQ(find_digits_in_venv((dir / "").string()), "");
  write_file(data / "digits.csv.gz", "x");
  EXPECT_EQ(fs::path(find_digits_in_venv((dir / "").string())), data / "digits.csv.gz");
}

TEST(Digits, SeededPermutationIsAReproduciblePermutation) {
  const auto a = seeded_permutation(100, 5), b = seeded_permutation(100, 5), c = seeded_permutation(100, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
}

TEST(Cifar, ReadsBinaryBatchesAndLimits) {
  TempDir dir;
  auto records = [](int n, int first_label) {
    std::string bytes;
    for (int r = 0; r < n; ++r) {
      bytes += static_cast<char>((first_label + r) % 10);
      bytes += std::string(3 * 32 * 32, static_cast<char>(r * 40));
    }
    return bytes;
  };
  for (int i = 1; i <= 5; ++i) write_file(dir / ("data_batch_" + std::to_string(i) + ".bin"), records(2, 2 * i));
  write_file(dir / "test_batch.bin", records(3, 0));
  const ImageData all = load_cifar10((dir / "").string(), 0, 0, 1);
  EXPECT_EQ(all.train.images.sizes(), (std::vector<int64_t>{10, 3, 32, 32}));
  EXPECT_EQ(all.test.size(), 3);
  EXPECT_EQ(all.train.labels[0].item<int64_t>(), 2);
  EXPECT_EQ(all.test.labels[2].item<int64_t>(), 2);
  const ImageData some = load_cifar10((dir / "").string(), 4, 2, 1);
  EXPECT_EQ(some.train.size(), 4);
  EXPECT_EQ(some.test.size(), 2);
  write_file(dir / "data_batch_3.bin", records(1, 0) + "x");
  EXPECT_THAT(error_of([&] { load_cifar10((dir / "").string(), 0, 0, 1); }), HasSubstr("data_batch_3.bin"));
  fs::remove(dir / "test_batch.bin");
  EXPECT_THAT(error_of([&] { load_cifar10((dir / "").string(), 0, 0, 1); }), HasSubstr("missing"));
}

}  // namespace
}  // namespace conveyor::examples
