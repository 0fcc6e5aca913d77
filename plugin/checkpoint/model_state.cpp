#include "plugin/checkpoint/model_state.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/model_names.h"
#include "plugin/support/atomic_file.h"

#include <c10/core/GradMode.h>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <utility>
#include <vector>

namespace conveyor {

namespace {

using checkpoint_values::Dict;
using checkpoint_values::new_dict;
using checkpoint_values::to_cpu;

using Named = std::vector<std::pair<std::string, at::Tensor>>;

void write_state(const std::string& path, const Named& tensors) {
  Dict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : tensors) d.insert(name, to_cpu(t));
  write_atomically(path, checkpoint_bytes(d));
}

Named named_state(const torch::nn::Module& model) {
  Named out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

}  // namespace

void save_model_state(const std::string& path, const Pipeline& pipe) {
  Named tensors = model_named_parameters(pipe);
  for (auto& b : model_named_buffers(pipe)) tensors.push_back(std::move(b));
  write_state(path, tensors);
}

void save_model_state(const std::string& path, const torch::nn::Module& model) { write_state(path, named_state(model)); }

void load_model_state(const std::string& path, torch::nn::Module& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("conveyor: cannot read '" + path + "': no such file");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  bool has_digest = false;
  const c10::IValue value = read_pickled(bytes, path, &has_digest);
  const std::string what = "conveyor: '" + path + "' ";
  if (!value.isGenericDict()) throw std::invalid_argument(what + "holds no dict of named tensors");
  Dict d = value.toGenericDict();
  if (d.contains("format")) {  // a checkpoint: its model
    if (d.at("format") != c10::IValue(kCheckpointFormat) || !has_digest) {
      throw std::invalid_argument(what + "is neither a state dict nor an intact Conveyor checkpoint");
    }
    d = checked::dict_field(d, "model", what + "is damaged: ");
  }
  const Named tensors = named_state(model);
  const std::vector<at::Tensor> values = model_values(d, tensors, what, what + "is damaged: ");
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].second.copy_(values[i]);
}

}  // namespace conveyor
