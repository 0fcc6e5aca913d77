// FusedLSTM's parameters as views into one buffer (flatten_parameters): the
// module's own parameter objects, the same values, gradients and optimizer
// steps as unflattened, and flat again after whatever re-points them. On
// CUDA the dispatched path (at::lstm, cuDNN) keeps them flat by itself, so
// cuDNN never compacts the weights per call.
#include "fused_lstm_testing.h"
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_lstm/fused_lstm_module.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <vector>

namespace conveyor {
namespace {

using testing::copy_parameters;
using torch::nn::LSTMOptions;

std::vector<const c10::TensorImpl*> impls(torch::nn::Module& m) {
  std::vector<const c10::TensorImpl*> out;
  for (const auto& p : m.parameters()) out.push_back(p.unsafeGetTensorImpl());
  return out;
}

// Two SGD steps on the squared output of a batch; the losses.
std::vector<double> train(FusedLSTM& lstm, torch::optim::Optimizer& optimizer, const at::Tensor& x) {
  std::vector<double> losses;
  for (int step = 0; step < 2; ++step) {
    optimizer.zero_grad();
    const at::Tensor loss = std::get<0>(lstm->forward(x)).pow(2).sum();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

TEST(FusedLstmFlatWeights, FlatParametersAreTheModulesOwnAndTrainAsBefore) {
  torch::manual_seed(3);
  const auto options = LSTMOptions(3, 5).num_layers(2);
  FusedLSTM flat(options), plain(options);
  flat->to(torch::kDouble);
  plain->to(torch::kDouble);
  copy_parameters(*plain, *flat);
  const auto before = impls(*flat);
  torch::optim::SGD flat_sgd(flat->parameters(), 0.1), plain_sgd(plain->parameters(), 0.1);  // made before

  EXPECT_FALSE(flat->parameters_flat());
  flat->flatten_parameters();
  ASSERT_TRUE(flat->parameters_flat());
  EXPECT_EQ(impls(*flat), before) << "the same parameter objects";
  const auto params = flat->parameters();
  for (const auto& p : params) EXPECT_TRUE(p.is_alias_of(params.front())) << "one buffer";
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], plain->parameters()[i])) << i;

  const at::Tensor x = torch::randn({4, 2, 3}, torch::kDouble);
  EXPECT_EQ(train(flat, flat_sgd, x), train(plain, plain_sgd, x));
  EXPECT_TRUE(flat->parameters_flat()) << "optimizer steps write in place";
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(flat->parameters()[i], plain->parameters()[i])) << i;
    EXPECT_TRUE(torch::equal(flat->parameters()[i].grad(), plain->parameters()[i].grad())) << i;
  }
}

TEST(FusedLstmFlatWeights, MovesAndLoadsRepointTheParametersAndFlatteningAgainKeepsThem) {
  torch::manual_seed(4);
  FusedLSTM lstm(LSTMOptions(3, 4));
  const auto before = impls(*lstm);
  lstm->flatten_parameters();
  lstm->to(torch::kDouble);
  EXPECT_FALSE(lstm->parameters_flat()) << "a dtype move gives each parameter new storage";
  lstm->flatten_parameters();
  EXPECT_TRUE(lstm->parameters_flat());

  FusedLSTM other(LSTMOptions(3, 4));
  other->to(torch::kDouble);
  std::stringstream file;
  torch::save(other, file);
  torch::load(lstm, file);
  EXPECT_FALSE(lstm->parameters_flat()) << "a load re-points them";
  lstm->flatten_parameters();
  EXPECT_TRUE(lstm->parameters_flat());
  EXPECT_EQ(impls(*lstm), before) << "through moves, loads and flattening: the same parameter objects";
  for (size_t i = 0; i < lstm->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(lstm->parameters()[i], other->parameters()[i])) << "the loaded values, parameter " << i;
  }
}

TEST(FusedLstmFlatWeightsCuda, TheDispatchedPathKeepsTheWeightsFlat) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const ScopedDispatch reference(DispatchPolicy::kReference);  // at::lstm, i.e. cuDNN
  torch::manual_seed(5);
  const auto options = LSTMOptions(8, 16).num_layers(2);
  torch::nn::LSTM torch_lstm(options);
  FusedLSTM fused(options);
  copy_parameters(*torch_lstm, *fused);
  torch_lstm->to(torch::kCUDA);
  fused->to(torch::kCUDA);
  const auto before = impls(*fused);
  torch::optim::Adam adam(fused->parameters());
  const at::Tensor x = torch::randn({6, 3, 8}, torch::kCUDA);
  auto step = [&] {
    adam.zero_grad();
    std::get<0>(fused->forward(x)).pow(2).sum().backward();
    adam.step();
  };
  step();
  EXPECT_TRUE(fused->parameters_flat()) << "the first call on CUDA flattens";
  step();
  EXPECT_TRUE(fused->parameters_flat()) << "optimizer steps keep them flat";
  std::stringstream file;
  torch::save(torch_lstm, file);
  torch::load(fused, file);
  EXPECT_FALSE(fused->parameters_flat());
  testing::expect_close(std::get<0>(fused->forward(x)), std::get<0>(torch_lstm->forward(x)), 1e-5, true,
                        "after a load");
  EXPECT_TRUE(fused->parameters_flat()) << "the next call flattens again";
  fused->to(torch::kCPU);
  fused->to(torch::kCUDA);
  std::get<0>(fused->forward(x));
  EXPECT_TRUE(fused->parameters_flat()) << "and after a device move";
  EXPECT_EQ(impls(*fused), before);
}

}  // namespace
}  // namespace conveyor
