#pragma once
// What the torch.export tests share: the fixtures that
// tests/python/make_export_fixtures.py writes (NAME.pt2 and NAME.ref.pt, the
// batch and what eager PyTorch computes on it), the models' split points for
// K = 2, 3, 4 stages, and their losses.

#include "plugin/core/types.h"
#include "tensor_files.h"
#include "test_models.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace conveyor::testing {

inline std::string export_fixture(const std::string& name) {
  const char* dir = std::getenv("CONVEYOR_EXPORT_FIXTURES");
  return dir ? (std::filesystem::path(dir) / name).string() : std::string();
}

#define REQUIRE_EXPORT_FIXTURES()                                                                    \
  if (!std::getenv("CONVEYOR_EXPORT_FIXTURES")) {                                                   \
    GTEST_SKIP() << "CONVEYOR_EXPORT_FIXTURES is not set (ctest runs make_export_fixtures.py first)"; \
  }

using NamedTensors = TensorMap;

// NAME.ref.pt: input.I, target.I, loss, grad.PARAM, step3.PARAM_OR_BUFFER.
inline NamedTensors export_reference(const std::string& model) {
  return read_tensors(export_fixture(model + ".ref.pt"));
}

inline Tensors numbered(const NamedTensors& ref, const std::string& prefix) {
  Tensors out;
  for (int i = 0; ref.count(prefix + std::to_string(i)); ++i) out.push_back(ref.at(prefix + std::to_string(i)));
  return out;
}

struct ExportCase {
  std::string model;
  bool cross_entropy;
  std::vector<std::vector<std::string>> splits;  // for K = 2, 3, 4
};

inline const std::vector<ExportCase>& export_cases() {
  static const std::vector<ExportCase> all = {
      {"mlp", false, {{"body.4"}, {"body.2", "body.4"}, {"body.2", "body.4", "head"}}},
      {"lstm_lm", true, {{"rnn2"}, {"rnn1", "rnn2"}, {"rnn1", "rnn2", "proj"}}},
      {"resblock", false, {{"block"}, {"block", "block.conv2"}, {"block.bn1", "block.conv2", "head"}}},
      {"transformer", false, {{"layers.1"}, {"layers.0", "layers.1"}, {"layers.0", "layers.1", "head"}}},
      {"seq2seq", true, {{"decoder"}, {"tgt_embed", "attend"}, {"encoder", "decoder", "combine"}}}};
  return all;
}

inline const ExportCase& export_case(const std::string& model) {
  for (const ExportCase& c : export_cases()) {
    if (c.model == model) return c;
  }
  throw std::invalid_argument("no export case " + model);
}

inline TensorsLossFn export_loss(bool cross_entropy) {
  if (cross_entropy) return [](const Tensors& o, const Tensors& t) { return lm_loss(o[0], t[0]); };
  return [](const Tensors& o, const Tensors& t) { return torch::mse_loss(o[0], t[0]); };
}

// Each of `got` within 1e-10 of the reference's `prefix`NAME (in its dtype).
inline void expect_like_reference(const std::vector<std::pair<std::string, at::Tensor>>& got,
                                  const NamedTensors& ref, const std::string& prefix, const std::string& where) {
  for (const auto& [name, t] : got) {
    ASSERT_TRUE(ref.count(prefix + name)) << where << ": eager PyTorch has no " << prefix << name;
    ASSERT_TRUE(t.defined()) << where << ": no " << prefix << name;
    const at::Tensor want = ref.at(prefix + name);
    EXPECT_LE((t.to(want.scalar_type()) - want).abs().max().item<double>(), 1e-10) << where << ": " << prefix << name;
  }
}

// How many of the reference's names begin with `prefix`.
inline size_t count_prefixed(const NamedTensors& ref, const std::string& prefix) {
  size_t n = 0;
  for (const auto& [key, t] : ref) n += key.rfind(prefix, 0) == 0;
  return n;
}

}  // namespace conveyor::testing
