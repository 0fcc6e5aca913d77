// The fused ops' dispatch table: its text form, which row decides a call, the
// policies and the environment (ops/dispatch/fused_dispatch.h). Which path the
// ops themselves then run is tested beside each op (test_fused_*_dispatch.cpp).
#include "ops/dispatch/fused_dispatch.h"

#include "error_of.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace conveyor {
namespace {

using ::testing::HasSubstr;

const char* const kTable = R"(
# two measured LSTM shapes on the CPU, one on a GPU
lstm cpu fp32 fused     batch=1  hidden=128 input=128 layers=1 seq=20 train=1 fused_ms=1.5 reference_ms=2
lstm cpu fp32 reference batch=64 hidden=128 input=128 layers=1 seq=20 train=1
lstm cpu fp32 reference batch=1  hidden=128 input=128 layers=1 seq=20 train=0   # forward only: another winner
lstm h100 bf16 fused    batch=8  hidden=1024 input=1024 layers=1 seq=50 train=1
attention cpu fp64 fused batch_heads=8 seq_q=64 seq_k=64 head_dim=32 causal=1 train=1
)";

DispatchQuery lstm_query(double batch, bool train = true, c10::ScalarType dtype = c10::kFloat) {
  return {"lstm",
          c10::Device(c10::kCPU),
          dtype,
          {{"batch", batch}, {"hidden", 128}, {"input", 128}, {"layers", 1}, {"seq", 20}, {"train", train ? 1.0 : 0.0}},
          {"train"}};
}

FusedPath path_of(const DispatchTable& table, const DispatchQuery& query, const std::string& device = "cpu") {
  const auto row = table.nearest(query, device);
  return row ? table.rows()[*row].path : FusedPath::kReference;
}

TEST(FusedDispatchTable, ParsesAndPrintsTheSameRows) {
  const DispatchTable table = DispatchTable::parse(kTable);
  ASSERT_EQ(table.rows().size(), 5u);
  const DispatchRow& first = table.rows()[0];
  EXPECT_EQ(first.op, "lstm");
  EXPECT_EQ(first.device, "cpu");
  EXPECT_EQ(first.path, FusedPath::kFused);
  EXPECT_EQ(first.shape.at("batch"), 1);
  EXPECT_EQ(first.measured.at("reference_ms"), 2);
  EXPECT_EQ(first.shape.count("fused_ms"), 0u) << "timings are not shape keys";
  const DispatchTable again = DispatchTable::parse(table.str());
  ASSERT_EQ(again.rows().size(), table.rows().size());
  for (size_t i = 0; i < table.rows().size(); ++i) EXPECT_EQ(again.rows()[i].str(), table.rows()[i].str());
}

TEST(FusedDispatchTable, TheNearestMeasuredShapeDecides) {
  const DispatchTable table = DispatchTable::parse(kTable);
  EXPECT_EQ(path_of(table, lstm_query(1)), FusedPath::kFused);
  EXPECT_EQ(path_of(table, lstm_query(3)), FusedPath::kFused);       // |log 3| < |log(64/3)|
  EXPECT_EQ(path_of(table, lstm_query(48)), FusedPath::kReference);  // nearer 64
  EXPECT_EQ(path_of(table, lstm_query(1, /*train=*/false)), FusedPath::kReference) << "train must be equal";
}

TEST(FusedDispatchTable, UnmeasuredShapesDtypesAndDevicesRunTheReference) {
  const DispatchTable table = DispatchTable::parse(kTable);
  std::string why;
  EXPECT_FALSE(table.nearest(lstm_query(1000), "cpu", &why).has_value()) << "over 4x from every row";
  EXPECT_THAT(why, HasSubstr("within 4x"));
  EXPECT_FALSE(table.nearest(lstm_query(1, true, c10::kDouble), "cpu", &why).has_value());
  EXPECT_THAT(why, HasSubstr("no measured lstm row for fp64 on cpu"));
  DispatchQuery gpu = lstm_query(8, true, c10::kBFloat16);
  gpu.device = c10::Device(c10::kCUDA, 0);
  gpu.shape["hidden"] = gpu.shape["input"] = 1024;
  gpu.shape["seq"] = 50;
  EXPECT_EQ(path_of(table, gpu, "NVIDIA H100 80GB HBM3"), FusedPath::kFused) << "'h100' is part of the name";
  EXPECT_FALSE(table.nearest(gpu, "NVIDIA A100-SXM4-80GB", &why).has_value()) << "another GPU is unmeasured";
  EXPECT_THAT(why, HasSubstr("on NVIDIA A100"));
  DispatchQuery attention{"attention",
                          c10::Device(c10::kCPU),
                          c10::kDouble,
                          {{"batch_heads", 8},
                           {"seq_q", 64},
                           {"seq_k", 64},
                           {"head_dim", 32},
                           {"causal", 0},
                           {"train", 1}},
                          {"causal", "train"}};
  EXPECT_FALSE(table.nearest(attention, "cpu").has_value()) << "causal must be equal";
  attention.shape["causal"] = 1;
  EXPECT_EQ(path_of(table, attention), FusedPath::kFused);
}

TEST(FusedDispatchTable, BadTextIsRefusedNamingTheLineAndTheCause) {
  const auto error = [](const std::string& text) {
    return testing::error_of([&] { DispatchTable::parse(text, "t"); });
  };
  EXPECT_THAT(error("lstm cpu fp32\n"), HasSubstr("t line 1: expected 'op device dtype path"));
  EXPECT_THAT(error("# ok\nconv cpu fp32 fused batch=1\n"), HasSubstr("t line 2: unknown op 'conv'"));
  EXPECT_THAT(error("lstm cpu int8 fused batch=1\n"), HasSubstr("unknown dtype 'int8'"));
  EXPECT_THAT(error("lstm cpu fp32 fastest batch=1\n"), HasSubstr("unknown path 'fastest' (fused or reference)"));
  EXPECT_THAT(error("lstm cpu fp32 fused batch\n"), HasSubstr("'batch' is not key=value"));
  EXPECT_THAT(error("lstm cpu fp32 fused batch=-2\n"), HasSubstr("batch must be a number >= 0, got '-2'"));
  EXPECT_THAT(error("lstm cpu fp32 fused batch=8x\n"), HasSubstr("got '8x'"));
  EXPECT_THAT(error("lstm cpu fp32 fused fused_ms=1\n"), HasSubstr("the row names no shape"));
  EXPECT_THAT(testing::error_of([] { DispatchTable::load("/nonexistent/table.txt"); }),
              HasSubstr("dispatch table /nonexistent/table.txt: cannot be read"));
}

TEST(FusedDispatchTable, PoliciesOverrideTheTableAndScopesRestoreThem) {
  const DispatchQuery query = lstm_query(64);
  {
    const ScopedDispatch table(DispatchPolicy::kTable, DispatchTable::parse(kTable));
    EXPECT_EQ(choose_fused_path(query).path, FusedPath::kReference);
    EXPECT_THAT(choose_fused_path(query).reason, HasSubstr("table row 2 (lstm cpu fp32 reference batch=64"));
    EXPECT_EQ(choose_fused_path(lstm_query(1)).path, FusedPath::kFused);
    EXPECT_EQ(choose_fused_path(lstm_query(1), /*fused_can_run=*/false).path, FusedPath::kReference);
    {
      const ScopedDispatch fused(DispatchPolicy::kFused);
      EXPECT_EQ(choose_fused_path(query).path, FusedPath::kFused);
      EXPECT_EQ(choose_fused_path(query, /*fused_can_run=*/false).path, FusedPath::kReference);
      const ScopedDispatch reference(DispatchPolicy::kReference);
      EXPECT_EQ(choose_fused_path(lstm_query(1)).path, FusedPath::kReference);
    }
    EXPECT_EQ(dispatch_policy(), DispatchPolicy::kTable);
    EXPECT_EQ(dispatch_table()->rows().size(), 5u);
  }
  EXPECT_EQ(dispatch_table()->rows().size(), DispatchTable::built_in().rows().size());
}

TEST(FusedDispatchTable, TheEnvironmentSetsThePolicyAndTheTable) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("conveyor_dispatch_env_test_" + std::to_string(::getpid()) + ".txt"))
                               .string();
  std::ofstream(path) << kTable;
  setenv("CONVEYOR_FUSED_DISPATCH", "reference", 1);
  setenv("CONVEYOR_FUSED_DISPATCH_TABLE", path.c_str(), 1);
  reload_dispatch_settings();
  EXPECT_EQ(dispatch_policy(), DispatchPolicy::kReference);
  EXPECT_EQ(dispatch_table()->rows().size(), 5u);
  setenv("CONVEYOR_FUSED_DISPATCH", "fastest", 1);
  reload_dispatch_settings();
  EXPECT_THAT(testing::error_of([] { dispatch_policy(); }),
              HasSubstr("CONVEYOR_FUSED_DISPATCH='fastest': expected table, fused or reference"));
  unsetenv("CONVEYOR_FUSED_DISPATCH");
  unsetenv("CONVEYOR_FUSED_DISPATCH_TABLE");
  reload_dispatch_settings();
  EXPECT_EQ(dispatch_policy(), DispatchPolicy::kTable);
  EXPECT_EQ(dispatch_table()->rows().size(), DispatchTable::built_in().rows().size());
  std::filesystem::remove(path);
}

TEST(FusedDispatchKernels, ARowNamesItsKernelAndTheOverridesComeFirst) {
  const std::vector<std::string> lstm_kernels{"persistent", "persistent_fma", "v1", "step"};
  EXPECT_EQ(fused_kernel_names("lstm"), lstm_kernels);
  EXPECT_EQ(fused_kernel_names("attention"), (std::vector<std::string>{"tiles128", "v1"}));
  EXPECT_TRUE(fused_kernel_names("conv").empty());
  const DispatchTable table = DispatchTable::parse(std::string(kTable) +
                                                   "lstm cpu fp32 fused batch=16 hidden=128 input=128 layers=1 seq=20 "
                                                   "train=1 kernel=step fused_ms=1 reference_ms=2\n");
  EXPECT_EQ(table.rows().back().kernel, "step");
  EXPECT_EQ(DispatchTable::parse(table.str()).rows().back().str(), table.rows().back().str()) << "kernel= round trips";
  const ScopedDispatch with(DispatchPolicy::kTable, table);
  EXPECT_EQ(fused_kernel(lstm_query(16)), "step") << "the nearest row names it";
  EXPECT_EQ(fused_kernel(lstm_query(1)), "persistent") << "a row naming none: the op's first";
  EXPECT_EQ(fused_kernel(lstm_query(5000)), "persistent") << "no row within 4x: the op's first";
  {
    const ScopedFusedKernel v1("lstm", "v1");
    EXPECT_EQ(fused_kernel(lstm_query(16)), "v1") << "the override beats the row";
    {
      const ScopedFusedKernel fma("lstm", "persistent_fma");
      EXPECT_EQ(fused_kernel(lstm_query(1)), "persistent_fma");
    }
    EXPECT_EQ(fused_kernel(lstm_query(1)), "v1") << "a scope restores the override before it";
  }
  EXPECT_EQ(fused_kernel(lstm_query(16)), "step");
  setenv("CONVEYOR_FUSED_KERNEL", "lstm=v1", 1);
  reload_dispatch_settings();
  EXPECT_EQ(fused_kernel(lstm_query(16)), "v1") << "the environment overrides";
  setenv("CONVEYOR_FUSED_KERNEL", "lstm=fastest", 1);
  reload_dispatch_settings();
  EXPECT_THAT(testing::error_of([] { fused_kernel(lstm_query(16)); }),
              HasSubstr("CONVEYOR_FUSED_KERNEL='lstm=fastest': lstm has no kernel 'fastest' (persistent, "
                        "persistent_fma, v1, step)"));
  unsetenv("CONVEYOR_FUSED_KERNEL");
  reload_dispatch_settings();
  set_dispatch_table(table);
  EXPECT_EQ(fused_kernel(lstm_query(16)), "step");
  const auto error = [](const std::string& text) {
    return testing::error_of([&] { DispatchTable::parse(text, "t"); });
  };
  EXPECT_THAT(error("lstm cpu fp32 fused batch=1 kernel=fast\n"),
              HasSubstr("t line 1: lstm has no kernel 'fast' (persistent, persistent_fma, v1, step)"));
  EXPECT_THAT(error("attention cpu fp32 fused batch_heads=1 kernel=v2\n"),
              HasSubstr("t line 1: attention has no kernel 'v2' (tiles128, v1)"));
  EXPECT_THAT(testing::error_of([] { set_fused_kernel("lstm", "v2"); }), HasSubstr("lstm has no kernel 'v2'"));
}

TEST(FusedDispatchTable, TheBuiltInTableHasCpuRowsForBothOps) {
  const DispatchTable table = DispatchTable::built_in();
  bool lstm = false, attention = false;
  for (const auto& row : table.rows()) {
    lstm |= row.op == "lstm" && row.device == "cpu";
    attention |= row.op == "attention" && row.device == "cpu";
    EXPECT_TRUE(row.measured.count("fused_ms") && row.measured.count("reference_ms")) << row.str();
  }
  EXPECT_TRUE(lstm && attention) << table.str();
}

}  // namespace
}  // namespace conveyor
