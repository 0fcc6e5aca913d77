// Every option is declared once (plugin/core/option_list.h): what Python passes
// reads back as the same default, each value given reaches the pipeline that
// runs, values are checked against their rows, and the manual's reference has
// a row for each.
#include "error_of.h"
#include "plugin/core/options.h"
#include "plugin/pipeline.h"
#include "plugin/builder/dict_options.h"
#include "plugin/builder/option_table.h"
#include "plugin/core/option_values.h"

#include "script_fixtures.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::fixture;

PythonOptions empty_dict() {
  return c10::impl::toTypedDict<std::string, c10::IValue>(
      c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()));
}

// Each option Python can give, by name, as Python's repr() shows its value.
template <typename Options>
std::map<std::string, std::string> shown(const Options& options) {
  std::vector<OptionDescription> rows;
  describe_options(options, rows);
  std::map<std::string, std::string> out;
  for (const auto& row : rows) {
    if (!row.type.empty()) out[row.name] = python_repr(row.default_value);
  }
  return out;
}

// Every default, written as Python holds it and read back, is the default.
template <typename Options>
void expect_defaults_read_back(const char* what) {
  const Options defaults;
  std::vector<OptionDescription> rows;
  describe_options(defaults, rows);
  int reachable = 0;
  for (const auto& row : rows) {
    if (row.type.empty()) continue;
    ++reachable;
    Options read;
    ASSERT_TRUE(read_option(read, row.name, row.default_value, ValueText::kTyped)) << what << " " << row.name;
    EXPECT_EQ(shown(read), shown(defaults)) << what << ": " << row.name << " read back otherwise";
  }
  EXPECT_GT(reachable, 0) << what;
}

TEST(Options, EveryDefaultPythonHoldsReadsBackAsTheDefault) {
  expect_defaults_read_back<PipelineOptions>("PipelineOptions");
}

TEST(Options, EveryOptionIsDescribedOnceWithItsDocumentation) {
  std::map<std::string, int> seen;
  for (const auto& row : every_option()) {
    EXPECT_FALSE(std::string(row.doc).empty()) << row.name;
    if (!row.type.empty()) EXPECT_EQ(++seen[row.name], 1) << row.name << " is declared twice for Python";
  }
  // C++-only rows (a factory, a profile) are in the table but not Python's.
  EXPECT_EQ(seen.count("profile"), 0u);
  EXPECT_EQ(seen.count("timeout"), 1u);
  EXPECT_EQ(seen.count("shared_memory"), 1u);
}

TEST(Options, ValuesGivenAsPythonGivesThemReachThePipeline) {
  REQUIRE_FIXTURES();
  const torch::jit::Module model = load_script(fixture("mlp.pt"));
  // Unset, and set to their defaults explicitly: the same pipeline options.
  PythonOptions all_defaults = empty_dict();
  for (const auto& row : every_option()) {
    if (!row.type.empty() && row.section != std::string("distributed")) {
      all_defaults.insert(row.name, row.default_value);
    }
  }
  const Pipeline unset(model, request_from_dict(empty_dict(), ValueText::kTyped));
  const Pipeline given(model, request_from_dict(all_defaults, ValueText::kTyped));
  EXPECT_EQ(shown(unset.options()), shown(given.options()));
  EXPECT_EQ(shown(unset.options()), shown(PipelineOptions()));

  // Values other than the defaults arrive as given, in the section the runtime takes.
  PythonOptions options = empty_dict();
  options.insert("workers", int64_t{2});
  options.insert("microbatches", int64_t{2});
  options.insert("schedule", std::string("gpipe"));
  options.insert("timeout", 2.5);
  options.insert("clip_norm_type", std::string("inf"));
  options.insert("loss_reduction", std::string("sum"));
  options.insert("channel_capacity", int64_t{3});
  options.insert("trace", false);
  options.insert("stage_rng", true);
  options.insert("recompute", true);
  options.insert("autocast", std::string("bf16"));
  const Pipeline pipe(model, request_from_dict(options, ValueText::kTyped));
  const PipelineOptions& o = pipe.runner().options();
  EXPECT_EQ(o.scheduling().workers, 2);
  EXPECT_EQ(o.batching().microbatches, 2);
  EXPECT_EQ(o.scheduling().schedule, "gpipe");
  EXPECT_EQ(o.running().timeout, std::chrono::milliseconds(2500));
  EXPECT_TRUE(std::isinf(o.training().clip_norm_type));
  EXPECT_EQ(o.batching().loss_reduction, LossReduction::kSum);
  EXPECT_EQ(o.running().channel_capacity, 3);
  EXPECT_FALSE(o.running().trace);
  EXPECT_TRUE(o.running().stage_rng);
  EXPECT_TRUE(o.scheduling().recompute);
  EXPECT_EQ(o.training().autocast, at::kBFloat16);
}

TEST(Options, ValuesAreCheckedAgainstTheirRows) {
  PipelineOptions o;
  const auto read = [&](const char* key, c10::IValue v, ValueText text = ValueText::kTyped) {
    return testing::invalid_argument_of([&] { read_option(o, key, v, text); });
  };
  EXPECT_EQ(read("microbatches", std::string("4")), "conveyor.Pipeline: microbatches must be an int, got str '4'");
  EXPECT_EQ(testing::error_of<OptionTypeError>([&] { read_option(o, "trace", int64_t{1}, ValueText::kTyped); }),
            "conveyor.Pipeline: trace must be True or False, got int 1");
  EXPECT_EQ(read("microbatches", std::string("4"), ValueText::kOrText), "(no exception thrown)");
  EXPECT_EQ(o.microbatches(), 4);
  EXPECT_EQ(read("balance", std::string("weight")),
            "conveyor.Pipeline: balance must be one of 'uniform', 'parameters', 'time', got str 'weight'");
  EXPECT_EQ(read("timeout", -1.0), "conveyor.Pipeline: timeout must be a positive number of seconds, got float -1.0");
  EXPECT_THAT(read("loss_scaling", c10::IValue(int64_t{3})), HasSubstr("loss_scaling must be True, or a dict of "
                                                                       "init_scale, growth_factor, backoff_factor, "
                                                                       "growth_interval"));
  // Bounds: each row's, wherever the value came from.
  EXPECT_EQ(testing::invalid_argument_of([] { check_bounds(PipelineOptions().microbatches(0)); }),
            "conveyor: microbatches must be at least 1, got 0");
  EXPECT_EQ(testing::invalid_argument_of([] { check_bounds(PipelineOptions().timeout(std::chrono::seconds(0))); }),
            "conveyor: timeout must be positive, got 0 ms");
  EXPECT_EQ(testing::invalid_argument_of([] { check_bounds(PipelineOptions().max_workers(-1)); }),
            "conveyor: max_workers must be at least 0, got -1");
}

TEST(Options, AnUnknownOptionListsTheKnownOnes) {
  PythonOptions options = empty_dict();
  options.insert("micro_batches", int64_t{2});
  EXPECT_THAT(testing::invalid_argument_of([&] { request_from_dict(options, ValueText::kOrText); }),
              AllOf(HasSubstr("unknown option 'micro_batches' (known: "), HasSubstr("microbatches"),
                    HasSubstr("shared_memory"), HasSubstr("split_points")));
}

// The manual's reference (docs/generate.py writes it from options_reference())
// has a row for every declared option, under its section's heading, in order.
TEST(Options, TheReferenceHasARowForEveryDeclaration) {
  const std::string reference = options_reference();
  size_t at = 0;
  std::string section;
  for (const OptionDescription& row : every_option()) {
    if (row.section != section) {
      section = row.section;
      at = reference.find("# " + section + "\n", at);
      ASSERT_NE(at, std::string::npos) << "no heading for section " << section << " in:\n" << reference;
    }
    at = reference.find("| `" + row.name + "` | ", at);
    ASSERT_NE(at, std::string::npos) << "no row for " << row.name << " after its section's heading";
  }
  EXPECT_THAT(reference, HasSubstr("| `microbatches` | `int` | `1` | Micro-batches each batch is split into"));
}

}  // namespace
}  // namespace conveyor
