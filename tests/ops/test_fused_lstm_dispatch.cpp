// Which path FusedLSTM, the swapped aten::lstm (conveyor::lstm) and a swapped
// torch::nn model take for which shapes, per the dispatch table, and that
// both paths give torch::nn::LSTM's outputs and gradients.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_lstm/fused_lstm.h"
#include "ops/fused_lstm/fused_lstm_module.h"
#include "ops/swap.h"

#include "op_call_counter.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace conveyor {
namespace {

constexpr const char* kFusedOp = "conveyor::fused_lstm";
constexpr const char* kAtenOp = "aten::lstm";

// Fused for micro-batches of 1..4 samples, cuDNN/ATen for 32 and more, as a
// GPU's table might say; train=0 rows choose the other way round.
const char* const kTable = R"(
lstm cpu fp64 fused     batch=2  hidden=16 input=8 layers=2 seq=5 train=1
lstm cpu fp64 reference batch=32 hidden=16 input=8 layers=2 seq=5 train=1
lstm cpu fp64 reference batch=2  hidden=16 input=8 layers=2 seq=5 train=0
lstm cpu fp64 fused     batch=32 hidden=16 input=8 layers=2 seq=5 train=0
)";

struct LstmRun {
  at::Tensor out;
  std::vector<at::Tensor> grads;
  int fused_calls = 0, aten_calls = 0;
};

// FusedLSTM and torch::nn::LSTM with the same weights on a batch of `batch`.
LstmRun run(torch::nn::Module& lstm, int64_t batch, bool train) {
  torch::manual_seed(11);
  const at::Tensor x = torch::randn({5, batch, 8}, torch::kDouble);
  for (auto& p : lstm.parameters()) p.mutable_grad() = at::Tensor();
  const testing::OpCallCounter counter({kFusedOp, kAtenOp});
  LstmRun r;
  if (train) {
    r.out = lstm.as<FusedLSTM>() ? std::get<0>(lstm.as<FusedLSTM>()->forward(x))
                                 : std::get<0>(lstm.as<torch::nn::LSTM>()->forward(x));
    r.out.pow(2).sum().backward();
    for (auto& p : lstm.parameters()) r.grads.push_back(p.grad().clone());
  } else {
    torch::NoGradGuard no_grad;
    r.out = lstm.as<FusedLSTM>() ? std::get<0>(lstm.as<FusedLSTM>()->forward(x))
                                 : std::get<0>(lstm.as<torch::nn::LSTM>()->forward(x));
  }
  r.fused_calls = counter.calls(kFusedOp);
  r.aten_calls = counter.calls(kAtenOp);
  return r;
}

class FusedLstmDispatch : public ::testing::Test {
 protected:
  FusedLstmDispatch() : torch_lstm(torch::nn::LSTMOptions(8, 16).num_layers(2)) {
    torch_lstm->to(torch::kDouble);
    fused = FusedLSTM(torch_lstm->options, *torch_lstm);
  }
  torch::nn::LSTM torch_lstm;
  FusedLSTM fused = nullptr;
  ScopedDispatch table{DispatchPolicy::kTable, DispatchTable::parse(kTable)};
};

TEST_F(FusedLstmDispatch, TheTableChoosesThePathPerBatchSizeAndMode) {
  struct Case {
    int64_t batch;
    bool train;
    bool fused;
  };
  for (const Case c : {Case{1, true, true}, Case{2, true, true}, Case{4, true, true}, Case{24, true, false},
                       Case{64, true, false}, Case{2, false, false}, Case{32, false, true}}) {
    const std::string where = "batch " + std::to_string(c.batch) + (c.train ? " training" : " forward only");
    const LstmRun want = run(*torch_lstm, c.batch, c.train);
    const LstmRun got = run(*fused, c.batch, c.train);
    EXPECT_EQ(got.fused_calls > 0, c.fused) << where;
    EXPECT_EQ(got.aten_calls, c.fused ? 0 : 1) << where;
    EXPECT_LE((got.out - want.out).abs().max().item<double>(), 1e-12) << where;
    ASSERT_EQ(got.grads.size(), want.grads.size()) << where;
    for (size_t i = 0; i < want.grads.size(); ++i) {
      EXPECT_LE((got.grads[i] - want.grads[i]).abs().max().item<double>(), 1e-10) << where << ", gradient " << i;
    }
  }
}

TEST_F(FusedLstmDispatch, UnmeasuredShapesAndDtypesRunATen) {
  const at::Tensor x = torch::randn({5, 512, 8}, torch::kDouble);  // 16x the largest measured batch
  const auto h = torch::zeros({2, 512, 16}, torch::kDouble);
  const DispatchChoice far = lstm_path(x, h, h, fused->flat_weights(), 2);
  EXPECT_EQ(far.path, FusedPath::kReference);
  EXPECT_NE(far.reason.find("within 4x"), std::string::npos) << far.reason;
  fused->to(torch::kFloat);
  const auto x32 = torch::randn({5, 2, 8});
  const auto h32 = torch::zeros({2, 2, 16});
  const DispatchChoice fp32 = lstm_path(x32, h32, h32, fused->flat_weights(), 2);
  EXPECT_EQ(fp32.path, FusedPath::kReference);
  EXPECT_NE(fp32.reason.find("no measured lstm row for fp32 on cpu"), std::string::npos) << fp32.reason;
}

TEST_F(FusedLstmDispatch, EveryKernelNameIsAKernelAndTheTableNamesTheOneACallRuns) {
  for (const auto& name : fused_kernel_names("lstm")) EXPECT_NO_THROW(lstm_kernel_named(name)) << name;
  EXPECT_EQ(lstm_kernel_named("v1"), LstmKernel::kV1);
  const ScopedDispatch rows(DispatchPolicy::kTable, DispatchTable::parse(std::string(kTable) + R"(
lstm cpu fp64 fused batch=8 hidden=16 input=8 layers=2 seq=5 train=1 kernel=step
lstm cpu fp64 fused batch=8 hidden=16 input=8 layers=2 seq=5 train=0 kernel=persistent_fma
)"));
  const LstmShape training{5, 8, 8, 16, 2, true}, inference{5, 8, 8, 16, 2, false};
  const c10::Device cpu(c10::kCPU);
  EXPECT_EQ(lstm_kernel(cpu, c10::kDouble, training), LstmKernel::kStep);
  EXPECT_EQ(lstm_kernel(cpu, c10::kDouble, inference), LstmKernel::kPersistentFma);
  EXPECT_EQ(lstm_kernel(cpu, c10::kFloat, training), LstmKernel::kPersistent) << "no fp32 row: the newest kernel";
  const ScopedFusedKernel v1("lstm", "v1");
  EXPECT_EQ(lstm_kernel(cpu, c10::kDouble, training), LstmKernel::kV1);
}

TEST_F(FusedLstmDispatch, TheSwappedAtenLstmFollowsTheTable) {
  const auto op = c10::Dispatcher::singleton()
                      .findSchemaOrThrow("conveyor::lstm", "")
                      .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                          const at::Tensor&, at::TensorList, at::TensorList, bool, int64_t, double, bool, bool,
                          bool)>();
  for (const int64_t batch : {2, 32}) {
    const at::Tensor x = torch::randn({5, batch, 8}, torch::kDouble).requires_grad_(true);
    const auto h = torch::zeros({2, batch, 16}, torch::kDouble);
    const testing::OpCallCounter counter({kFusedOp});
    const auto [out, h_n, c_n] = op.call(x, {h, h}, fused->flat_weights(), true, 2, 0.0, true, false, false);
    const auto [want, want_h, want_c] =
        at::lstm(x, {h, h}, fused->flat_weights(), true, 2, 0.0, true, false, false);
    EXPECT_EQ(counter.calls(kFusedOp), batch == 2 ? 1 : 0) << "batch " << batch;
    EXPECT_LE((out - want).abs().max().item<double>(), 1e-12) << "batch " << batch;
  }
}

TEST_F(FusedLstmDispatch, ASwappedSequentialRunsTheTablesPath) {
  torch::nn::Sequential model(torch::nn::LSTM(torch::nn::LSTMOptions(8, 16).num_layers(2)));
  model->to(torch::kDouble);
  const SwapReport report = swap_fused_ops(model.ptr());
  ASSERT_EQ(report.swapped.size(), 1u) << report.to_string();
  const at::Tensor small = torch::randn({5, 2, 8}, torch::kDouble);
  const at::Tensor large = torch::randn({5, 32, 8}, torch::kDouble);
  const testing::OpCallCounter counter({kFusedOp, kAtenOp});
  std::get<0>(model->forward<std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>>(small)).sum().backward();
  EXPECT_EQ(counter.calls(kFusedOp), 1);
  EXPECT_EQ(counter.calls(kAtenOp), 0);
  std::get<0>(model->forward<std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>>>(large)).sum().backward();
  EXPECT_EQ(counter.calls(kFusedOp), 1);
  EXPECT_EQ(counter.calls(kAtenOp), 1);
}

}  // namespace
}  // namespace conveyor
