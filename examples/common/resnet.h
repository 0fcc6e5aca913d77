#pragma once
// A ResNet for small images (He et al., "Deep Residual Learning", section 4.2:
// the CIFAR-10 networks of depth 6n+2) built as a torch::nn::Sequential whose
// elements are whole units: the stem convolution, each basic block (two 3x3
// convolutions and their shortcut), and the pooling + linear head. A pipeline
// boundary between elements therefore never separates a block's convolutions
// from its shortcut, which is the partition rule of the model-parallel study
// this example reproduces.
//
//   auto net = conveyor::examples::make_resnet({.depth = 20, .width = 16});  // ResNet-20: 11 elements
//   auto cut = conveyor::examples::resnet_boundaries(config, 4);            // 4 stages of blocks
//
// Widths are width, 2*width, 4*width over three groups of n = (depth-2)/6
// blocks; the first block of groups 2 and 3 halves the resolution and uses a
// 1x1 projection shortcut, every other block an identity shortcut.

#include "plugin/planner/partition.h"

#include <torch/torch.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor::examples {

struct ResNetConfig {
  int64_t depth = 20;       // 6n+2: 8, 14, 20, 32, 44, 56, 110
  int64_t width = 16;       // channels of the first group
  int64_t in_channels = 3;  // 1 for grey images
  int64_t image_size = 32;  // height = width of the input, for the cost estimate
  int64_t num_classes = 10;
};

// Throws std::invalid_argument naming the field for a configuration that does not describe a network.
inline void check_resnet_config(const ResNetConfig& c) {
  if (c.depth < 8 || (c.depth - 2) % 6 != 0) {
    throw std::invalid_argument("ResNet depth must be 6n+2 with n >= 1 (8, 14, 20, 32, ...), got " +
                                std::to_string(c.depth));
  }
  if (c.width < 1) throw std::invalid_argument("ResNet width must be positive, got " + std::to_string(c.width));
  if (c.in_channels < 1)
    throw std::invalid_argument("ResNet in_channels must be positive, got " + std::to_string(c.in_channels));
  if (c.image_size < 4)
    throw std::invalid_argument("ResNet image_size must be at least 4, got " + std::to_string(c.image_size));
  if (c.num_classes < 2)
    throw std::invalid_argument("ResNet num_classes must be at least 2, got " + std::to_string(c.num_classes));
}

inline int64_t resnet_blocks_per_group(const ResNetConfig& c) { return (c.depth - 2) / 6; }

// Stem, 3n blocks, head.
inline int64_t resnet_num_elements(const ResNetConfig& c) { return 3 * resnet_blocks_per_group(c) + 2; }

inline torch::nn::Conv2dOptions conv_options(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false);
}

// conv3x3 -> batch norm -> ReLU.
class StemImpl : public torch::nn::Cloneable<StemImpl> {
 public:
  StemImpl(int64_t in, int64_t out) : in_(in), out_(out) { reset(); }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv2d(conv_options(in_, out_, 3, 1)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out_));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(bn(conv(x))); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};

 private:
  int64_t in_, out_;
};
TORCH_MODULE(Stem);

// relu(bn(conv(relu(bn(conv(x))))) + shortcut(x)); the shortcut is the
// identity, or a strided 1x1 convolution + batch norm when the shape changes.
class BasicBlockImpl : public torch::nn::Cloneable<BasicBlockImpl> {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) : in_(in), out_(out), stride_(stride) { reset(); }
  void reset() override {
    conv1 = register_module("conv1", torch::nn::Conv2d(conv_options(in_, out_, 3, stride_)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(out_));
    conv2 = register_module("conv2", torch::nn::Conv2d(conv_options(out_, out_, 3, 1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(out_));
    if (stride_ != 1 || in_ != out_) {
      project = register_module("project", torch::nn::Conv2d(conv_options(in_, out_, 1, stride_)));
      project_bn = register_module("project_bn", torch::nn::BatchNorm2d(out_));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (project ? project_bn(project(x)) : x));
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, project{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, project_bn{nullptr};

 private:
  int64_t in_, out_, stride_;
};
TORCH_MODULE(BasicBlock);

// Global average pooling -> linear.
class HeadImpl : public torch::nn::Cloneable<HeadImpl> {
 public:
  HeadImpl(int64_t in, int64_t classes) : in_(in), classes_(classes) { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(in_, classes_)); }
  at::Tensor forward(const at::Tensor& x) { return fc(x.mean({2, 3})); }
  torch::nn::Linear fc{nullptr};

 private:
  int64_t in_, classes_;
};
TORCH_MODULE(Head);

// One element of the Sequential, with a name and an estimate of its
// multiply-adds per image (forward), used to balance the stages.
struct ResNetElement {
  std::string name;
  double macs = 0;
};

// The elements make_resnet builds, in order.
inline std::vector<ResNetElement> resnet_elements(const ResNetConfig& c) {
  check_resnet_config(c);
  std::vector<ResNetElement> out;
  int64_t size = c.image_size;
  const auto conv = [&](int64_t in, int64_t out_ch, int64_t k) { return double(size * size * in * out_ch * k * k); };
  out.push_back({"stem(" + std::to_string(c.in_channels) + "->" + std::to_string(c.width) + ")",
                 conv(c.in_channels, c.width, 3)});
  int64_t in = c.width;
  for (int64_t group = 0; group < 3; ++group) {
    const int64_t width = c.width << group;
    for (int64_t i = 0; i < resnet_blocks_per_group(c); ++i) {
      const bool down = group > 0 && i == 0;
      if (down) size = (size + 1) / 2;
      double macs = conv(in, width, 3) + conv(width, width, 3) + ((down || in != width) ? conv(in, width, 1) : 0.0);
      out.push_back({"block" + std::to_string(group + 1) + "." + std::to_string(i + 1) + "(" + std::to_string(in) +
                         "->" + std::to_string(width) + (down ? ",/2" : "") + ")",
                     macs});
      in = width;
    }
  }
  out.push_back(
      {"head(" + std::to_string(in) + "->" + std::to_string(c.num_classes) + ")", double(in * c.num_classes)});
  return out;
}

// The network; its elements match resnet_elements(c) one to one.
inline torch::nn::Sequential make_resnet(const ResNetConfig& c) {
  check_resnet_config(c);
  torch::nn::Sequential net;
  net->push_back(Stem(c.in_channels, c.width));
  int64_t in = c.width;
  for (int64_t group = 0; group < 3; ++group) {
    const int64_t width = c.width << group;
    for (int64_t i = 0; i < resnet_blocks_per_group(c); ++i) {
      net->push_back(BasicBlock(in, width, group > 0 && i == 0 ? 2 : 1));
      in = width;
    }
  }
  net->push_back(Head(in, c.num_classes));
  return net;
}

// K-1 split points (PipelineOptions::boundaries) that place the elements on
// `num_stages` contiguous stages, the largest stage's multiply-adds as small
// as possible; the stem and head, being light, ride along with a neighbouring
// block. Throws std::invalid_argument when there are more stages than elements.
inline std::vector<int64_t> resnet_boundaries(const ResNetConfig& c, int num_stages) {
  const auto elements = resnet_elements(c);
  const auto n = static_cast<int64_t>(elements.size());
  if (num_stages < 1 || num_stages > n) {
    throw std::invalid_argument("a ResNet-" + std::to_string(c.depth) + " has " + std::to_string(n) +
                                " elements (stem, blocks, head): it splits into 1.." + std::to_string(n) +
                                " stages, not " + std::to_string(num_stages));
  }
  std::vector<double> costs;
  for (const auto& e : elements) costs.push_back(e.macs);
  return balanced_boundaries(costs, num_stages);
}

}  // namespace conveyor::examples
