// Which path dispatched_attention (what FusedMultiheadAttention and so
// EncoderLayer run) takes for which shapes and masks, per the dispatch table,
// and that both paths give the same outputs and gradients.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_attention/fused_attention.h"
#include "ops/fused_attention/fused_attention_module.h"

#include "op_call_counter.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace conveyor {
namespace {

constexpr const char* kFusedOp = "conveyor::fused_attention";
constexpr const char* kSdpaOp = "aten::scaled_dot_product_attention";

// Fused for short sequences, SDPA for long ones; causal calls always SDPA
// (unmasked calls: the rows name no mask, which reads as mask=0).
const char* const kTable = R"(
attention cpu fp64 fused     batch_heads=4 seq_q=8   seq_k=8   head_dim=16 causal=0 train=1
attention cpu fp64 reference batch_heads=4 seq_q=128 seq_k=128 head_dim=16 causal=0 train=1
attention cpu fp64 reference batch_heads=4 seq_q=8   seq_k=8   head_dim=16 causal=1 train=1
)";

struct AttentionRun {
  at::Tensor out, grad_q, grad_k, grad_v;
  int fused_calls = 0, sdpa_calls = 0;
};

AttentionRun run(int64_t seq, bool causal, const std::optional<at::Tensor>& mask = std::nullopt) {
  torch::manual_seed(seq);
  const auto options = torch::TensorOptions().dtype(torch::kDouble).requires_grad(true);
  const at::Tensor q = torch::randn({2, 2, seq, 16}, options);
  const at::Tensor k = torch::randn({2, 2, seq, 16}, options);
  const at::Tensor v = torch::randn({2, 2, seq, 16}, options);
  const testing::OpCallCounter counter({kFusedOp, kSdpaOp});
  AttentionRun r;
  r.out = dispatched_attention(q, k, v, mask, causal);
  r.fused_calls = counter.calls(kFusedOp);
  r.sdpa_calls = counter.calls(kSdpaOp);
  r.out.pow(2).sum().backward();
  r.grad_q = q.grad();
  r.grad_k = k.grad();
  r.grad_v = v.grad();
  return r;
}

void expect_same(const AttentionRun& got, const AttentionRun& want, const std::string& where) {
  EXPECT_LE((got.out - want.out).abs().max().item<double>(), 1e-10) << where;
  EXPECT_LE((got.grad_q - want.grad_q).abs().max().item<double>(), 1e-10) << where;
  EXPECT_LE((got.grad_k - want.grad_k).abs().max().item<double>(), 1e-10) << where;
  EXPECT_LE((got.grad_v - want.grad_v).abs().max().item<double>(), 1e-10) << where;
}

TEST(FusedAttentionDispatch, TheTableChoosesThePathPerShapeAndCausality) {
  const ScopedDispatch table(DispatchPolicy::kTable, DispatchTable::parse(kTable));
  struct Case {
    int64_t seq;
    bool causal;
    bool fused;
  };
  for (const Case c : {Case{8, false, true}, Case{16, false, true}, Case{96, false, false}, Case{8, true, false},
                       Case{2048, false, false}}) {
    if (c.seq > 256) {  // too large to run here: the choice alone
      const auto t = torch::zeros({2, 2, c.seq, 16}, torch::kDouble);
      EXPECT_EQ(attention_path(t, t, t, std::nullopt, c.causal).path, FusedPath::kReference);
      continue;
    }
    const std::string where = "seq " + std::to_string(c.seq) + (c.causal ? " causal" : "");
    const AttentionRun got = run(c.seq, c.causal);
    EXPECT_EQ(got.fused_calls, c.fused ? 1 : 0) << where;
    EXPECT_EQ(got.sdpa_calls, c.fused ? 0 : 1) << where;
    AttentionRun other;
    {
      const ScopedDispatch flip(c.fused ? DispatchPolicy::kReference : DispatchPolicy::kFused);
      other = run(c.seq, c.causal);
      EXPECT_EQ(other.fused_calls, c.fused ? 0 : 1) << where;
    }
    expect_same(got, other, where);
  }
}

TEST(FusedAttentionDispatch, AMaskedCallRunsTheTablesPathAndBothKeepFullyMaskedRowsAtZero) {
  // Masked rows of their own: fused at 128 keys, the reference at 8.
  const ScopedDispatch table(DispatchPolicy::kTable, DispatchTable::parse(std::string(kTable) + R"(
attention cpu fp64 fused     batch_heads=4 seq_q=128 seq_k=128 head_dim=16 causal=0 mask=1 train=1
attention cpu fp64 reference batch_heads=4 seq_q=8   seq_k=8   head_dim=16 causal=0 mask=1 train=1
attention cpu fp64 fused     batch_heads=4 seq_q=8   seq_k=8   head_dim=16 causal=1 mask=1 train=1
)"));
  for (const int64_t seq : {8, 128}) {
    for (const bool causal : {false, true}) {
      if (seq == 128 && causal) continue;  // no row: the reference, as tested above
      at::Tensor mask = torch::zeros({2, seq}, torch::kBool);
      mask[0].fill_(true);                    // every key of sample 0 hidden: its rows must be 0, not NaN
      mask[1].slice(0, 0, seq / 4).fill_(true);  // the first keys of sample 1: causal rows before them see none
      const std::string where = "seq " + std::to_string(seq) + (causal ? " causal" : "");
      const bool fused = seq == 128 || causal;
      const AttentionRun got = run(seq, causal, mask);
      EXPECT_EQ(got.fused_calls, fused ? 1 : 0) << where << ": the row for masked calls decides";
      EXPECT_EQ(got.sdpa_calls, fused ? 0 : 1) << where;
      AttentionRun other;
      {
        const ScopedDispatch flip(fused ? DispatchPolicy::kReference : DispatchPolicy::kFused);
        other = run(seq, causal, mask);
        EXPECT_EQ(other.fused_calls, fused ? 0 : 1) << where;
      }
      for (const AttentionRun* r : std::initializer_list<const AttentionRun*>{&got, &other}) {
        EXPECT_TRUE(r->out.isfinite().all().item<bool>()) << where;
        EXPECT_TRUE(r->grad_q.isfinite().all().item<bool>() && r->grad_k.isfinite().all().item<bool>()) << where;
        EXPECT_EQ(r->out[0].abs().max().item<double>(), 0.0) << where;
        EXPECT_EQ(r->grad_q[0].abs().max().item<double>(), 0.0) << where;
        if (causal) EXPECT_EQ(r->out[1].slice(1, 0, seq / 4).abs().max().item<double>(), 0.0) << where;
      }
      expect_same(got, other, where);
    }
  }
  // Unmasked calls ignore the masked rows.
  EXPECT_EQ(run(128, false).sdpa_calls, 1);
}

TEST(FusedAttentionDispatch, AMaskedCallWithNoMeasuredRowRunsTheFusedKernel) {
  // kTable has rows for unmasked calls only.
  const ScopedDispatch table(DispatchPolicy::kTable, DispatchTable::parse(kTable));
  at::Tensor mask = torch::zeros({2, 128}, torch::kBool);
  mask[1].slice(0, 100).fill_(true);
  const AttentionRun got = run(128, false, mask);
  EXPECT_EQ(got.fused_calls, 1);
  EXPECT_EQ(got.sdpa_calls, 0);
  const auto t = torch::zeros({2, 2, 128, 16}, torch::kDouble);
  EXPECT_NE(attention_path(t, t, t, mask, false).reason.find("no measured row for masked calls"), std::string::npos);
}

TEST(FusedAttentionDispatch, AMaskedReferenceCallChecksItsArgumentsAsTheFusedOpDoes) {
  const auto t = torch::zeros({2, 2, 8, 16});
  const at::Tensor wrong = torch::zeros({2, 7}, torch::kBool);
  try {
    masked_reference_attention(t, t, t, wrong, false);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("key_padding_mask"), std::string::npos) << e.what();
  }
}

TEST(FusedAttentionDispatch, TheModuleRunsTheTablesPathWithTheSameResults) {
  const ScopedDispatch table(DispatchPolicy::kTable, DispatchTable::parse(kTable));
  torch::manual_seed(2);
  torch::nn::MultiheadAttention mha(torch::nn::MultiheadAttentionOptions(32, 2));  // head_dim 16
  mha->to(torch::kDouble);
  FusedMultiheadAttention fused(mha->options);
  fused->use_parameters_of(*mha);
  for (const int64_t seq : {8, 128}) {
    const at::Tensor x = torch::randn({seq, 2, 32}, torch::kDouble);  // [L, N, E]: batch 2 x 2 heads
    const testing::OpCallCounter counter({kFusedOp, kSdpaOp});
    const at::Tensor got = std::get<0>(fused->forward(x, x, x, {}, /*need_weights=*/false));
    EXPECT_EQ(counter.calls(kFusedOp), seq == 8 ? 1 : 0) << "seq " << seq;
    EXPECT_EQ(counter.calls(kSdpaOp), seq == 8 ? 0 : 1) << "seq " << seq;
    const at::Tensor want = std::get<0>(mha->forward(x, x, x, {}, /*need_weights=*/false));
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-10) << "seq " << seq;
  }
}

}  // namespace
}  // namespace conveyor
