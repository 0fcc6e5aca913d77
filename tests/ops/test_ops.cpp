// The plugin's operator library: registered ops run through the dispatcher,
// exactly as Python's torch.ops.conveyor.* calls them.
#include "ops/nonfinite/nonfinite.h"
#include "test_models.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace conveyor {
namespace {

c10::OperatorHandle op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

TEST(Ops, ScheduleOpReturnsTheTextForm) {
  const auto schedule = op("conveyor::schedule").typed<std::string(const std::string&, int64_t, int64_t)>();
  EXPECT_EQ(schedule.call("1f1b", 2, 2), schedules::make_1f1b(2, 2).str());
  EXPECT_THROW(schedule.call("zigzag", 2, 2), std::exception);
}

TEST(Ops, ValidateAndSimulateOps) {
  const auto validate = op("conveyor::validate_schedule").typed<void(const std::string&, int64_t)>();
  EXPECT_NO_THROW(validate.call(schedules::make_gpipe(3, 4).str(), 2));
  try {
    validate.call("0B0 0F0\n", 2);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("backward before its forward 0F0"));
  }
  const auto simulate = op("conveyor::simulate")
                            .typed<std::tuple<double, double, std::vector<int64_t>>(
                                const std::string&, std::vector<double>, std::vector<double>, double)>();
  const std::vector<double> f(4, 1.0), b(4, 2.0);
  const auto [makespan, bubble, peak] = simulate.call(schedules::make_1f1b(4, 8).str(), f, b, 0.0);
  EXPECT_DOUBLE_EQ(makespan, (8 + 4 - 1) * 3.0);
  EXPECT_DOUBLE_EQ(bubble, 3.0 / 11.0);
  EXPECT_EQ(peak, (std::vector<int64_t>{4, 3, 2, 1}));
}

TEST(Ops, CountNonfiniteOnCpu) {
  const double inf = std::numeric_limits<double>::infinity();
  const at::Tensor a = torch::tensor({1.0, std::nan(""), 3.0});
  const at::Tensor b = torch::tensor({inf, -inf, 0.0}, torch::kFloat32);
  const at::Tensor c = torch::tensor({1, 2, 3});  // integers are always finite
  EXPECT_EQ(count_nonfinite({a, b, c}).item<int64_t>(), 3);
  EXPECT_EQ(count_nonfinite({torch::ones({4, 4}, torch::kBFloat16)}).item<int64_t>(), 0);
  EXPECT_EQ(count_nonfinite({}).item<int64_t>(), 0);
  EXPECT_TRUE(all_finite({c, torch::zeros({2})}));
  EXPECT_FALSE(all_finite({a}));
  // Finite elements whose sum overflows are still finite; a half tensor whose
  // half-precision sum would overflow too; complex parts count one each.
  EXPECT_EQ(count_nonfinite({torch::full({4}, 3e38, torch::kFloat32)}).item<int64_t>(), 0);
  EXPECT_EQ(count_nonfinite({torch::full({4096}, 60000.0, torch::kHalf)}).item<int64_t>(), 0);
  at::Tensor big = torch::randn({1 << 16});
  big[(1 << 16) - 1] = std::nan("");
  EXPECT_EQ(count_nonfinite({big, torch::full({3}, -inf).t()}).item<int64_t>(), 1 + 3);
  const at::Tensor z = torch::complex(torch::tensor({1.0, std::nan("")}), torch::tensor({inf, 2.0}));
  EXPECT_EQ(count_nonfinite({z, z.conj()}).item<int64_t>(), 2 + 2);
}

TEST(Ops, CountNonfiniteOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  at::Tensor a = torch::randn({1000, 37}, torch::device(torch::kCUDA));
  a.index_put_({5, 3}, std::nan(""));
  a.index_put_({999, 36}, std::numeric_limits<float>::infinity());
  const at::Tensor h = torch::full({513}, 70000.0, torch::device(torch::kCUDA)).to(torch::kHalf);  // overflows half
  EXPECT_EQ(count_nonfinite({a, h, a.to(torch::kBFloat16), a.to(torch::kFloat64)}).item<int64_t>(), 2 + 513 + 2 + 2);
}

}  // namespace
}  // namespace conveyor
