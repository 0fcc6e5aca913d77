#include "plugin/checkpoint/checkpoint_set.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_decode.h"
#include "plugin/checkpoint/checkpoint_values.h"
#include "plugin/core/errors.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <utility>

namespace conveyor {

namespace {

using checkpoint_values::Dict;
using checkpoint_values::List;
using checkpoint_values::new_dict;
using checkpoint_values::new_list;

std::string damaged_text(const std::string& path) { return "conveyor: checkpoint '" + path + "' is damaged: "; }

// One file's entry of a stage it holds.
struct Holder {
  const std::string* path;
  Dict stage;
};

// Stage k's optimizer state put together from its replicas' parts: each
// field of each weight of n elements is the concatenation of the replicas'
// pieces of ceil(n / D), cut to n and shaped as the weight (`model`'s).
Dict whole_optimizer_state(const std::vector<Holder>& holders, int64_t k, const Dict& model, size_t files) {
  std::map<int64_t, std::pair<const std::string*, Dict>> parts;  // by replica
  int64_t replicas = -1;
  for (const Holder& h : holders) {
    if (!checked::has_value(h.stage, "optimizer_shard")) {
      throw std::invalid_argument(c10::str("conveyor: checkpoint '", *h.path, "' holds stage ", k,
                                           "'s optimizer state whole, and another file one replica's part of it: ",
                                           "they are not one checkpoint"));
    }
    const std::string what = damaged_text(*h.path) + c10::str("stage ", k, "'s shard ");
    const Dict part = checked::dict_field(h.stage, "optimizer_shard", what);
    const int64_t replica = checked::int_field(part, "replica", what);
    const int64_t count = checked::int_field(part, "replicas", what);
    if (count < 1 || replica < 0 || replica >= count) {
      throw std::invalid_argument(c10::str(what, "is replica ", replica, " of ", count));
    }
    if (replicas >= 0 && count != replicas) {
      throw std::invalid_argument(c10::str("conveyor: checkpoint files split stage ", k, "'s optimizer state across ",
                                           replicas, " and ", count, " replicas ('", *h.path,
                                           "'): they are not one checkpoint"));
    }
    replicas = count;
    parts.emplace(replica, std::make_pair(h.path, checked::dict_field(part, "optimizer", what)));
  }
  for (int64_t d = 0; d < replicas; ++d) {
    if (parts.count(d) == 0) {
      throw std::invalid_argument(c10::str("conveyor: stage ", k, "'s optimizer state is split across ", replicas,
                                           " replicas, and none of the ", files, " checkpoint files given holds ",
                                           "replica ", d, "'s part: the file of stage ", k, "'s replica ", d,
                                           " is missing"));
    }
  }
  const auto& [first_path, first] = parts.at(0);
  Dict whole = first.copy();
  Dict state = new_dict();
  for (const auto& entry : checked::dict_field(first, "state", damaged_text(*first_path))) {
    const std::string name = entry.key().toStringRef();
    const std::string what = damaged_text(*first_path) + c10::str("stage ", k, "'s optimizer state of '", name, "' ");
    if (!checked::has(model, name)) throw std::invalid_argument(what + "is of no tensor of the model");
    const at::Tensor weight = checked::tensor_field(model, name, what);
    const int64_t piece = (weight.numel() + replicas - 1) / replicas;
    Dict fields = new_dict();
    for (const auto& field : checked::to_dict(entry.value(), name, what)) {
      const std::string key = field.key().toStringRef();
      if (!field.value().isTensor()) {  // a count ("step"): the same on every replica
        fields.insert(key, field.value());
        continue;
      }
      std::vector<at::Tensor> pieces;
      for (const auto& [d, saved] : parts) {
        const std::string where = damaged_text(*saved.first) + c10::str("stage ", k, "'s optimizer state of '", name,
                                                                          "' (replica ", d, ") ");
        const Dict replica_state = checked::dict_field(checked::dict_field(saved.second, "state", where), name, where);
        const at::Tensor t = checked::tensor_field(replica_state, key, where);
        check_argument(t.numel() == piece, where, "'", key, "' has ", t.numel(), " elements, not ", piece);
        pieces.push_back(t.reshape({-1}));
      }
      fields.insert(key, at::cat(pieces).narrow(0, 0, weight.numel()).view(weight.sizes()).clone());
    }
    state.insert(name, fields);
  }
  whole.insert_or_assign("state", state);
  return whole;
}

}  // namespace

std::vector<CheckpointFile> read_checkpoint_files(const std::vector<std::string>& paths) {
  std::vector<CheckpointFile> files;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument("conveyor: cannot read checkpoint '" + path + "': no such file");
    files.push_back({path, std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>())});
  }
  return files;
}

std::string files_label(const std::vector<std::string>& paths) {
  std::string label;
  for (size_t i = 0; i < paths.size() && i < 4; ++i) label += (i ? ", " : "") + paths[i];
  if (paths.size() > 4) label += c10::str(" and ", paths.size() - 4, " more");
  return label;
}

Dict merge_checkpoints(const std::vector<CheckpointFile>& files) {
  check_argument(!files.empty(), "conveyor: no checkpoint files given");
  std::vector<Dict> dicts;
  for (const auto& f : files) dicts.push_back(read_checkpoint(f.bytes, f.path));
  if (files.size() == 1) return dicts[0];
  const std::string& first = files[0].path;
  const int64_t stages = checked::int_field(dicts[0], "num_stages", damaged_text(first));
  const int64_t step = checked::int_field(dicts[0], "step", damaged_text(first));
  Dict model = new_dict();
  std::vector<List> saved;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& path = files[i].path;
    const std::string damaged = damaged_text(path);
    const int64_t n = checked::int_field(dicts[i], "num_stages", damaged);
    const int64_t s = checked::int_field(dicts[i], "step", damaged);
    if (n != stages || s != step) {
      throw std::invalid_argument(c10::str("conveyor: checkpoint files '", first, "' and '", path, "' are of ", stages,
                                           " and ", n, " stages, at steps ", step, " and ", s,
                                           ": they are not one checkpoint"));
    }
    if (!checked::list_field(dicts[i], "optimizers", damaged).empty()) {
      throw std::invalid_argument("conveyor: checkpoint '" + path + "' holds the state of an optimizer the caller " +
                                  "owns (TrainingState::optimizers), which is one process's: files merge with the " +
                                  "pipeline's own optimizers (PipelineOptions::optimizer) only");
    }
    for (const auto& entry : checked::dict_field(dicts[i], "model", damaged)) {
      if (!model.contains(entry.key())) model.insert(entry.key(), entry.value());
    }
    saved.push_back(checked::list_field(dicts[i], "stages", damaged));
    check_argument(static_cast<int64_t>(saved.back().size()) == stages, damaged, "it has ", saved.back().size(),
                   " stages' entries for ", stages, " stages");
  }
  List merged = new_list();
  for (int64_t k = 0; k < stages; ++k) {
    std::vector<Holder> holders;
    for (size_t i = 0; i < files.size(); ++i) {
      const std::string label = c10::str("stage ", k);
      const Dict s = checked::to_dict(saved[i].get(k), label, damaged_text(files[i].path));
      if (!checked::has(s, "local") || checked::to_bool(s.at("local"), label, damaged_text(files[i].path))) {
        holders.push_back({&files[i].path, s});
      }
    }
    if (holders.empty()) {
      throw std::invalid_argument(c10::str("conveyor: none of the ", files.size(),
                                           " checkpoint files given holds stage ", k, " of ", stages,
                                           ": the file of a process that ran stage ", k, " is missing"));
    }
    Dict entry = holders[0].stage.copy();
    if (checked::has_value(entry, "optimizer_shard")) {
      entry.insert_or_assign("optimizer", whole_optimizer_state(holders, k, model, files.size()));
      entry.insert_or_assign("optimizer_shard", c10::IValue());
    }
    entry.insert_or_assign("local", true);
    merged.push_back(entry);
  }
  Dict out = dicts[0].copy();
  out.insert_or_assign("model", model);
  out.insert_or_assign("stages", merged);
  return out;
}

}  // namespace conveyor
