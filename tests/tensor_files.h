#pragma once
// Tensors by name in a file (a pickled dict, as torch.save writes one): how
// the multi-process tests' ranks hand back what they computed, and how the
// fixture scripts hand over what eager PyTorch computed.

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace conveyor::testing {

using TensorMap = std::map<std::string, at::Tensor>;

inline void write_tensors(const std::string& path, const TensorMap& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) dict.insert(name, t.detach().clone());
  const std::vector<char> bytes = torch::pickle_save(dict);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Empty if there is no file.
inline TensorMap read_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TensorMap out;
  if (bytes.empty()) return out;
  for (const auto& item : torch::pickle_load(bytes).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

}  // namespace conveyor::testing
