#pragma once
// Small image-classification data sets for the examples, read without Python:
//
//  - scikit-learn's "digits" (UCI optical digits): 1,797 grey 8x8 images of
//    the digits 0-9, shipped inside the scikit-learn package as
//    sklearn/datasets/data/digits.csv.gz (64 pixel values in 0..16 and the
//    label per line). The images are upsampled bilinearly to the size asked
//    for and split into train and test with a fixed seed.
//  - CIFAR-10 in its binary form (data_batch_1..5.bin, test_batch.bin: per
//    image one label byte and 3x32x32 pixel bytes, channel-major).
//
// Both come back normalised: every channel has mean 0 and standard deviation
// 1 over the train images (the test images use the train statistics).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::examples {

struct ImageSet {
  at::Tensor images;  // [N, C, H, W] float32
  at::Tensor labels;  // [N] int64 in [0, classes)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

struct ImageData {
  ImageSet train, test;
  int64_t channels = 0, image_size = 0, classes = 0;
  std::string source;  // where it came from, for the log
};

// A permutation of 0..n-1 drawn from a seeded Mersenne twister by
// Fisher-Yates with our own index draw, so that it is the same with every
// standard library (std::shuffle's is not).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// The text of a gzip file, decompressed by the system's `gzip -dc` (run
// directly, without a shell; gzip is part of every Linux base system, so this
// adds no build dependency). A path not ending in ".gz" is read as is. Throws
// std::runtime_error naming the file when it is missing or gzip fails.
std::string read_maybe_gzipped(const std::string& path);

// scikit-learn's digits.csv.gz inside a virtual environment: the first
// <venv>/lib/python*/site-packages/sklearn/datasets/data/digits.csv.gz that
// exists; "" if none does.
std::string find_digits_in_venv(const std::string& venv);

// The digits, upsampled to image_size x image_size (>= 8), shuffled with
// split_seed; the first train_count images train, the rest test. Throws
// std::runtime_error for a malformed file (naming the line) and
// std::invalid_argument for a train_count that leaves no test image.
ImageData load_digits(const std::string& csv_gz_path, int64_t image_size, int64_t train_count, uint64_t split_seed);

// CIFAR-10 from DIR/data_batch_{1..5}.bin and DIR/test_batch.bin; a limit > 0
// keeps that many images of the split (a seeded random subset), 0 keeps all.
// Throws std::runtime_error naming the file that is missing or truncated.
ImageData load_cifar10(const std::string& dir, int64_t train_limit, int64_t test_limit, uint64_t split_seed);

}  // namespace conveyor::examples
