// Autocast inside every stage: the loss and gradients of a bf16 or fp16
// pipeline against the unsplit model under the same autocast, which dtype
// each layer ran in and crossed a boundary in, and training that converges
// under every kind of schedule.
#include "test_models.h"

#include <ATen/autocast_mode.h>

#include <memory>
#include <mutex>
#include <vector>

namespace conveyor {
namespace {

using testing::sgd;

// ---------------------------------------------------------------------------
// Autocast.

// Records the dtype of what passes through it (the stages' threads may
// record at the same time: one lock for every probe).
std::mutex probe_mutex;
struct DtypeProbeImpl : torch::nn::Cloneable<DtypeProbeImpl> {
  explicit DtypeProbeImpl(std::shared_ptr<std::vector<c10::ScalarType>> seen) : seen(std::move(seen)) {}
  void reset() override {}  // a clone records into the same list
  at::Tensor forward(const at::Tensor& x) {
    const std::lock_guard<std::mutex> lock(probe_mutex);
    seen->push_back(x.scalar_type());
    return x;
  }
  std::shared_ptr<std::vector<c10::ScalarType>> seen;
};
TORCH_MODULE(DtypeProbe);

// Linear, probe, Tanh, Linear, probe | probe, LayerNorm, probe, Linear, probe
// (K = 2 cuts after the fifth layer).
torch::nn::Sequential probed_mlp(const std::shared_ptr<std::vector<c10::ScalarType>>& seen) {
  return torch::nn::Sequential(torch::nn::Linear(8, 32), DtypeProbe(seen), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                               DtypeProbe(seen), DtypeProbe(seen),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})), DtypeProbe(seen),
                               torch::nn::Linear(32, 3), DtypeProbe(seen));
}

struct AutocastGuard {
  explicit AutocastGuard(c10::ScalarType dtype) {
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
    at::autocast::set_autocast_dtype(c10::DeviceType::CPU, dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
  }
};

TEST(Autocast, LossAndGradientsEqualTheUnsplitModelUnderAutocastAndShowWhichOpsRanInWhichDtype) {
  for (c10::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const std::string where = c10::toString(dtype);
    torch::manual_seed(12);
    auto seen = std::make_shared<std::vector<c10::ScalarType>>();
    auto model = probed_mlp(seen);
    auto reference = testing::clone_of(model);
    const at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 3});
    at::Tensor ref_loss;
    {
      AutocastGuard autocast(dtype);
      ref_loss = testing::mse(reference->forward(x), y);
    }
    EXPECT_EQ(ref_loss.scalar_type(), at::kFloat) << where << ": mse_loss runs in fp32 under CPU autocast";
    ref_loss.backward();
    const std::vector<c10::ScalarType> reference_dtypes = *seen;
    seen->clear();

    StageRunner pipe(model, PipelineOptions().workers(2).microbatches(1).schedule("1f1b").autocast(dtype));
    ASSERT_EQ(pipe.split().stages[1].begin, 5) << "the cut the probes assume";
    c10::ScalarType loss_dtype = at::kDouble, output_dtype = at::kDouble;
    const StepResult r = pipe.train_step(x, y, [&](const at::Tensor& out, const at::Tensor& target) {
      output_dtype = out.scalar_type();
      const at::Tensor loss = testing::mse(out, target);
      loss_dtype = loss.scalar_type();
      return loss;
    });
    // Which ops ran in which dtype: every Linear, Tanh and LayerNorm in the
    // low dtype (CPU autocast's policy), the activation crossing the boundary
    // as stage 0 produced it, and the loss (mse_loss) in fp32, as in the
    // unsplit model.
    const std::vector<c10::ScalarType> expected(5, dtype);
    EXPECT_EQ(*seen, expected) << where;
    EXPECT_EQ(reference_dtypes, expected) << where;
    EXPECT_EQ(output_dtype, dtype) << where;
    EXPECT_EQ(loss_dtype, at::kFloat) << where;
    EXPECT_EQ(r.activation_bytes_sent[0], 8 * 32 * 2) << where << ": half of fp32's bytes";
    EXPECT_EQ(r.gradient_bytes_sent[1], 8 * 32 * 2) << where << ": the gradient travels back in the same dtype";
    EXPECT_NEAR(r.loss, ref_loss.item<double>(), 1e-6) << where;
    for (const auto& p : pipe.parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat) << where << ": weights stay fp32";
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat) << where << ": gradients stay fp32";
    }
    // The same ops in the same dtypes on the same data: equal up to the low
    // dtype's rounding of the split batch (stated: 1e-2 of the gradient's scale).
    testing::expect_same_grads(pipe, reference, 1e-4, 1e-2, where);
  }
}

TEST(Autocast, AnFp32PipelineSendsTwiceTheBytes) {
  torch::manual_seed(13);
  auto seen = std::make_shared<std::vector<c10::ScalarType>>();
  StageRunner pipe(probed_mlp(seen), PipelineOptions().workers(2).microbatches(2));
  const StepResult r = pipe.train_step(torch::randn({8, 8}), torch::randn({8, 3}), testing::mse);
  EXPECT_EQ(r.activation_bytes_sent, std::vector<int64_t>({8 * 32 * 4, 0}));
  EXPECT_EQ(r.gradient_bytes_sent, std::vector<int64_t>({0, 8 * 32 * 4}));
}

TEST(Autocast, Bf16TrainingWithAndWithoutClippingLowersTheLossOnEverySchedule) {
  for (const char* schedule : {"1f1b", "interleaved", "zb-v", "pipedream", "fr"}) {
    for (const bool autocast : {false, true}) {
      for (const bool clip : {false, true}) {
        torch::manual_seed(14);
        auto options = PipelineOptions().workers(2).microbatches(4).schedule(schedule).optimizer(sgd(0.1, 0.9));
        if (autocast) options.autocast(at::kBFloat16);
        if (clip) options.clip_grad_norm(1.0);
        StageRunner pipe(testing::make_mlp(torch::kFloat32), options);
        const at::Tensor x = torch::randn({32, 8});
        const at::Tensor y = torch::tanh(x.narrow(1, 0, 3));
        const double first = pipe.train_step(x, y, testing::mse).loss;
        double last = first;
        for (int step = 0; step < 40; ++step) last = pipe.train_step(x, y, testing::mse).loss;
        EXPECT_LT(last, 0.7 * first) << schedule << (autocast ? " bf16" : " fp32") << (clip ? " clipped" : "");
      }
    }
  }
}

}  // namespace
}  // namespace conveyor
