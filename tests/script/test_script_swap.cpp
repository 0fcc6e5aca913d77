// swap_fused_ops on TorchScript models: scripted and traced torch.nn.LSTMs
// call conveyor::lstm afterwards, with the outputs and gradients of
// aten::lstm; LSTMs the fused op cannot run are left alone and reported; the
// original module keeps its code; a pipeline of the swapped model keeps the
// unsplit model's gradients.
#include "built_pipeline.h"
#include "ops/dispatch/fused_dispatch.h"
#include "ops/swap.h"
#include "plugin/script/torchscript.h"

#include "op_call_counter.h"
#include "script_fixtures.h"
#include "test_models.h"

#include <torch/csrc/jit/api/function_impl.h>

#include <map>

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using testing::fixture;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

// Whether any method of `module` (not its children) calls `op`.
bool calls(const torch::jit::Module& module, const std::string& op) {
  for (const auto& method : module.get_methods()) {
    const auto* function = torch::jit::tryToGraphFunction(method.function());
    if (function == nullptr) continue;
    std::ostringstream graph;
    graph << *function->graph();
    if (graph.str().find(op + "(") != std::string::npos) return true;
  }
  return false;
}

torch::jit::Module submodule(const torch::jit::Module& model, const std::string& path) {
  torch::jit::Module m = model;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    m = m.attr(path.substr(start, dot - start)).toModule();
    start = dot + 1;
  }
  return m;
}

// Output and every parameter's gradient, from a fresh backward.
std::pair<at::Tensor, std::map<std::string, at::Tensor>> run(torch::jit::Module& model, const at::Tensor& tokens,
                                                             const at::Tensor& targets) {
  for (const auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
  const at::Tensor out = model.forward({tokens}).toTensor();
  testing::lm_loss(out, targets).backward();
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : model.named_parameters()) grads[p.name] = p.value.grad().clone();
  return {out.detach(), grads};
}

void expect_same_results(torch::jit::Module& original, torch::jit::Module& swapped, const std::string& where) {
  torch::manual_seed(5);
  const at::Tensor tokens = torch::randint(testing::kVocab, {4, 7});
  const at::Tensor targets = torch::randint(testing::kVocab, {4, 7});
  const ScopedDispatch fused_kernels(DispatchPolicy::kFused);  // what the counter checks for
  const testing::OpCallCounter counter({"conveyor::fused_lstm"});
  const auto [want_out, want_grads] = run(original, tokens, targets);
  EXPECT_EQ(counter.calls("conveyor::fused_lstm"), 0) << where << ": the original model ran the fused op";
  const auto [got_out, got_grads] = run(swapped, tokens, targets);
  EXPECT_GE(counter.calls("conveyor::fused_lstm"), 1) << where << ": the swapped model did not run the fused op";
  EXPECT_LE((got_out - want_out).abs().max().item<double>(), 1e-10) << where;
  ASSERT_EQ(got_grads.size(), want_grads.size()) << where;
  for (const auto& [name, grad] : want_grads) {
    ASSERT_EQ(got_grads.count(name), 1u) << where << ": " << name;
    EXPECT_LE((got_grads.at(name) - grad).abs().max().item<double>(), 1e-10) << where << ": gradient of " << name;
  }
}

TEST(ScriptSwap, ScriptedLstmsRunFusedWithTheSameOutputsAndGradients) {
  REQUIRE_FIXTURES();
  torch::jit::Module original = load_script(fixture("lstm_mix.pt"));
  torch::jit::Module model = original;
  const SwapReport report = swap_fused_ops(model);

  EXPECT_THAT(report.swapped_paths(), ElementsAre("deep.lstm")) << report.to_string();
  ASSERT_TRUE(report.skip_reason("both.lstm").has_value()) << report.to_string();
  EXPECT_THAT(*report.skip_reason("both.lstm"), HasSubstr("bidirectional"));
  ASSERT_TRUE(report.skip_reason("projected.lstm").has_value()) << report.to_string();
  EXPECT_THAT(*report.skip_reason("projected.lstm"), HasSubstr("proj_size"));

  EXPECT_TRUE(calls(submodule(model, "deep.lstm"), "conveyor::lstm"));
  EXPECT_FALSE(calls(submodule(model, "both.lstm"), "conveyor::lstm"));
  EXPECT_FALSE(calls(submodule(original, "deep.lstm"), "conveyor::lstm")) << "the original's code changed";
  EXPECT_TRUE(calls(submodule(original, "deep.lstm"), "aten::lstm"));

  // The clone shares the original's tensors: an optimizer over either trains both.
  const auto before = original.named_parameters();
  const auto after = model.named_parameters();
  ASSERT_EQ(before.size(), after.size());
  for (auto b = before.begin(), a = after.begin(); b != before.end(); ++b, ++a) {
    EXPECT_EQ((*b).name, (*a).name);
    EXPECT_TRUE((*b).value.is_same((*a).value)) << (*b).name;
  }
  expect_same_results(original, model, "lstm_mix.pt");
}

TEST(ScriptSwap, TracedLstmsRunFusedWithTheSameOutputsAndGradients) {
  REQUIRE_FIXTURES();
  torch::jit::Module original = load_script(fixture("lstm_traced.pt"));
  torch::jit::Module model = original;
  const SwapReport report = swap_fused_ops(model);
  EXPECT_THAT(report.swapped_paths(), UnorderedElementsAre("rnn1.lstm", "rnn2.lstm")) << report.to_string();
  EXPECT_TRUE(report.skipped.empty()) << report.to_string();
  expect_same_results(original, model, "lstm_traced.pt");
}

TEST(ScriptSwap, APipelineOfTheSwappedModelKeepsTheUnsplitGradients) {
  REQUIRE_FIXTURES();
  const ScopedDispatch fused_kernels(DispatchPolicy::kFused);  // the stages run the fused kernel itself
  torch::manual_seed(3);
  const at::Tensor tokens = torch::randint(testing::kVocab, {6, 5});
  const at::Tensor targets = torch::randint(testing::kVocab, {6, 5});
  torch::jit::Module reference = load_script(fixture("lstm_lm.pt"));
  testing::lm_loss(reference.forward({tokens}).toTensor(), targets).backward();

  for (const char* schedule : {"gpipe", "1f1b"}) {
    for (int k = 2; k <= 4; ++k) {
      const std::string where = std::string(schedule) + " K=" + std::to_string(k);
      torch::jit::Module model = load_script(fixture("lstm_lm.pt"));
      EXPECT_EQ(swap_fused_ops(model).swapped.size(), 2u) << where;
      const auto pipe = testing::built_pipeline(model, PipelineOptions().workers(k).microbatches(3).schedule(schedule));
      pipe->train_step(tokens, targets, testing::lm_loss);
      testing::expect_same_grads(*pipe, reference, 1e-10, where);
    }
  }
}

}  // namespace
}  // namespace conveyor
