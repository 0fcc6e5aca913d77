#include "plugin/checkpoint/model_state.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_file.h"
#include "plugin/checkpoint/checkpoint_set.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/model/model_names.h"
#include "plugin/support/atomic_file.h"

#include <c10/core/GradMode.h>
#include <torch/serialize/output-archive.h>

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

void save_model_state(const std::string& path, const StageRunner& pipe) {
  Named tensors = model_named_parameters(pipe);
  for (auto& b : model_named_buffers(pipe)) tensors.push_back(std::move(b));
  write_state(path, tensors);
}

void save_model_state(const std::string& path, const torch::nn::Module& model) { write_state(path, named_state(model)); }

void save_model_state(const std::string& path, const Named& state) { write_state(path, state); }

namespace {

// Copies `d` (a state dict, or a checkpoint's dict: its model) into `model`.
void load_dict(Dict d, bool has_digest, const std::string& path, torch::nn::Module& model) {
  const std::string what = "conveyor: '" + path + "' ";
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

}  // namespace

void load_model_state(const std::string& path, torch::nn::Module& model) {
  const std::vector<CheckpointFile> file = read_checkpoint_files({path});
  bool has_digest = false;
  const c10::IValue value = read_pickled(file[0].bytes, path, &has_digest);
  if (!value.isGenericDict()) throw std::invalid_argument("conveyor: '" + path + "' holds no dict of named tensors");
  load_dict(value.toGenericDict(), has_digest, path, model);
}

void load_model_state_files(const std::vector<std::string>& paths, torch::nn::Module& model) {
  load_dict(merge_checkpoints(read_checkpoint_files(paths)), true, files_label(paths), model);
}

void export_model_state(const std::vector<std::string>& paths, const std::string& out) {
  const Dict merged = merge_checkpoints(read_checkpoint_files(paths));
  const Dict model = checked::dict_field(merged, "model", "conveyor: '" + files_label(paths) + "' is damaged: ");
  Named tensors;
  for (const auto& entry : model) {
    tensors.emplace_back(entry.key().toStringRef(), checked::to_tensor(entry.value(), entry.key().toStringRef(),
                                                                       "conveyor: checkpoint model "));
  }
  write_state(out, tensors);
}

void save_model_archive(const std::string& path, const torch::nn::Module& model) {
  torch::serialize::OutputArchive archive;
  model.save(archive);
  write_atomically(path, [&](std::ostream& out) { archive.save_to(out); });
}

}  // namespace conveyor
