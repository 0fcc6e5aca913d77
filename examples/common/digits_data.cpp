#include "examples/common/digits_data.h"

#include <torch/torch.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace conveyor::examples {

namespace fs = std::filesystem;

namespace {

std::string read_fd(int fd) {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      out.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  return out;
}

ImageSet take(const at::Tensor& images, const at::Tensor& labels, const std::vector<int64_t>& order, int64_t begin,
              int64_t end) {
  const at::Tensor index =
      torch::tensor(std::vector<int64_t>(order.begin() + begin, order.begin() + end), torch::kLong);
  return {images.index_select(0, index).contiguous(), labels.index_select(0, index).contiguous()};
}

// Per-channel standardisation with the train split's statistics.
void normalise(ImageData& d) {
  const at::Tensor mean = d.train.images.mean({0, 2, 3}, /*keepdim=*/true);
  const at::Tensor std = d.train.images.std({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true).clamp_min(1e-6);
  d.train.images = ((d.train.images - mean) / std).contiguous();
  d.test.images = ((d.test.images - mean) / std).contiguous();
}

// Appends the CIFAR-10 binary records of `path`: pixel bytes and labels.
void read_cifar_file(const fs::path& path, std::vector<uint8_t>& pixels, std::vector<int64_t>& labels) {
  constexpr size_t kImageBytes = 3 * 32 * 32, kRecordBytes = 1 + kImageBytes;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("CIFAR-10: cannot open " + path.string());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty() || bytes.size() % kRecordBytes != 0) {
    throw std::runtime_error("CIFAR-10: " + path.string() + " has " + std::to_string(bytes.size()) +
                             " bytes, not a whole number of " + std::to_string(kRecordBytes) + "-byte records");
  }
  for (size_t r = 0; r < bytes.size(); r += kRecordBytes) {
    const auto label = static_cast<unsigned char>(bytes[r]);
    if (label > 9) {
      throw std::runtime_error("CIFAR-10: " + path.string() + " record " + std::to_string(r / kRecordBytes) +
                               " has label " + std::to_string(label) + " (expected 0..9)");
    }
    labels.push_back(label);
    pixels.insert(pixels.end(), bytes.begin() + static_cast<std::ptrdiff_t>(r + 1),
                  bytes.begin() + static_cast<std::ptrdiff_t>(r + kRecordBytes));
  }
}

// The images of `files` as [N,3,32,32] floats in 0..1; the subset is taken
// before the conversion so that a small limit stays cheap.
ImageSet cifar_split(const std::vector<fs::path>& files, int64_t limit, uint64_t seed) {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;
  for (const auto& f : files) read_cifar_file(f, pixels, labels);
  const auto n = static_cast<int64_t>(labels.size());
  at::Tensor images = torch::from_blob(pixels.data(), {n, 3, 32, 32}, torch::kUInt8);
  at::Tensor targets = torch::tensor(labels, torch::kLong);
  ImageSet set = (limit <= 0 || limit >= n) ? ImageSet{images, targets}
                                            : take(images, targets, seeded_permutation(n, seed), 0, limit);
  set.images = set.images.to(torch::kFloat).div_(255.0);  // a copy: `pixels` may go
  return set;
}

}  // namespace

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
  return order;
}

std::string read_maybe_gzipped(const std::string& path) {
  if (!fs::is_regular_file(path)) throw std::runtime_error("no such file: " + path);
  if (!path.ends_with(".gz")) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) throw std::runtime_error("cannot make a pipe to gzip");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) posix_spawn_file_actions_addclose(&actions, fd);
  std::string arg0 = "gzip", arg1 = "-dc", arg2 = "--", arg3 = path;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), arg3.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gzip", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  std::string text, errors;
  if (spawned == 0) {
    text = read_fd(out_pipe[0]);  // gzip's few lines of stderr fit the pipe's buffer: no deadlock
    errors = read_fd(err_pipe[0]);
  }
  ::close(out_pipe[0]);
  ::close(err_pipe[0]);
  if (spawned != 0) {
    throw std::runtime_error("cannot run 'gzip' to read " + path + ": " + std::strerror(spawned));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("'gzip -dc " + path + "' failed: " + (errors.empty() ? "no message" : errors));
  }
  return text;
}

std::string find_digits_in_venv(const std::string& venv) {
  std::error_code ec;
  const fs::path lib = fs::path(venv) / "lib";
  if (venv.empty() || !fs::is_directory(lib, ec)) return "";
  std::vector<fs::path> candidates;
  for (const auto& entry : fs::directory_iterator(lib, ec)) {
    if (!entry.path().filename().string().starts_with("python")) continue;
    const fs::path file = entry.path() / "site-packages/sklearn/datasets/data/digits.csv.gz";
    if (fs::is_regular_file(file, ec)) candidates.push_back(file);
  }
  std::sort(candidates.begin(), candidates.end());  // deterministic when there are several
  return candidates.empty() ? "" : candidates.front().string();
}

ImageData load_digits(const std::string& csv_gz_path, int64_t image_size, int64_t train_count, uint64_t split_seed) {
  constexpr int64_t kPixels = 64;
  if (image_size < 8)
    throw std::invalid_argument("digits: image_size must be at least 8, got " + std::to_string(image_size));
  const std::string text = read_maybe_gzipped(csv_gz_path);
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::istringstream lines(text);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.empty() || line == "\r") continue;
    std::vector<double> fields;
    const char* p = line.c_str();
    for (;;) {
      char* end = nullptr;
      const double value = std::strtod(p, &end);
      if (end == p) break;
      fields.push_back(value);
      p = end;
      if (*p != ',') break;
      ++p;
    }
    if (fields.size() != kPixels + 1 || (*p != '\0' && *p != '\r')) {
      throw std::runtime_error("digits: line " + std::to_string(number) + " of " + csv_gz_path + " has " +
                               std::to_string(fields.size()) + " readable fields, expected 65 (64 pixels, a label)");
    }
    for (int64_t i = 0; i < kPixels; ++i) {
      if (fields[i] < 0 || fields[i] > 16) {
        throw std::runtime_error("digits: line " + std::to_string(number) + " has pixel " + std::to_string(i) + " = " +
                                 std::to_string(fields[i]) + " outside 0..16");
      }
      pixels.push_back(static_cast<float>(fields[i] / 16.0));
    }
    const double label = fields[kPixels];
    if (label < 0 || label > 9 || label != static_cast<int64_t>(label)) {
      throw std::runtime_error("digits: line " + std::to_string(number) + " has label " + std::to_string(label) +
                               " (expected an integer 0..9)");
    }
    labels.push_back(static_cast<int64_t>(label));
  }
  const auto n = static_cast<int64_t>(labels.size());
  if (n == 0) throw std::runtime_error("digits: " + csv_gz_path + " holds no images");
  if (train_count < 1 || train_count >= n) {
    throw std::invalid_argument("digits: the train split must hold 1.." + std::to_string(n - 1) + " of the " +
                                std::to_string(n) + " images (at least one is left to test), got " +
                                std::to_string(train_count));
  }
  at::Tensor images = torch::tensor(pixels).view({n, 1, 8, 8});
  if (image_size != 8) {
    namespace F = torch::nn::functional;
    images = F::interpolate(images, F::InterpolateFuncOptions()
                                        .size(std::vector<int64_t>{image_size, image_size})
                                        .mode(torch::kBilinear)
                                        .align_corners(false));
  }
  const at::Tensor targets = torch::tensor(labels, torch::kLong);
  const auto order = seeded_permutation(n, split_seed);
  ImageData d;
  d.train = take(images, targets, order, 0, train_count);
  d.test = take(images, targets, order, train_count, n);
  d.channels = 1;
  d.image_size = image_size;
  d.classes = 10;
  d.source = "scikit-learn digits (" + csv_gz_path + "), 8x8 upsampled bilinearly to " + std::to_string(image_size) +
             "x" + std::to_string(image_size);
  normalise(d);
  return d;
}

ImageData load_cifar10(const std::string& dir, int64_t train_limit, int64_t test_limit, uint64_t split_seed) {
  std::vector<fs::path> train_files;
  for (int i = 1; i <= 5; ++i) train_files.push_back(fs::path(dir) / ("data_batch_" + std::to_string(i) + ".bin"));
  const fs::path test_file = fs::path(dir) / "test_batch.bin";
  for (const auto& f : train_files) {
    if (!fs::is_regular_file(f)) throw std::runtime_error("CIFAR-10: missing " + f.string());
  }
  if (!fs::is_regular_file(test_file)) throw std::runtime_error("CIFAR-10: missing " + test_file.string());
  ImageData d;
  d.train = cifar_split(train_files, train_limit, split_seed);
  d.test = cifar_split({test_file}, test_limit, split_seed + 1);
  d.channels = 3;
  d.image_size = 32;
  d.classes = 10;
  d.source = "CIFAR-10 (" + dir + ")";
  normalise(d);
  return d;
}

}  // namespace conveyor::examples
