#include "plugin/checkpoint/checkpoint_reshard.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/stage_optimizer.h"

#include <c10/util/StringUtil.h>

#include <map>
#include <stdexcept>

namespace conveyor {

using checkpoint_values::Dict;
using checkpoint_values::List;
using checkpoint_values::new_dict;
using checkpoint_values::new_list;
using checkpoint_values::stage_optimizer_label;

ResharedStages reshard_stages(const List& saved_stages, const CheckpointTarget& target, const std::string& what,
                              const std::string& damaged) {
  const int64_t saved_count = static_cast<int64_t>(saved_stages.size());
  const auto refuse = [&](const std::string& why) {
    throw std::invalid_argument(c10::str(what, "is of a pipeline of ", saved_count, " stages, this one has ",
                                         target.num_stages, ", and ", why));
  };
  for (const auto& s : target.stages) {
    if (s.random) refuse("this pipeline has stage-owned random streams (stage_rng), which are per stage");
  }
  ResharedStages out;
  std::string type;
  std::map<std::string, double> lr;  // per parameter name, its saved group's
  Dict state = new_dict();            // per parameter name, its saved fields
  int with_optimizer = 0;
  for (int64_t k = 0; k < saved_count; ++k) {
    const std::string label = c10::str("stage ", k);
    const Dict s = checked::to_dict(saved_stages.get(k), label, damaged);
    if (checked::has(s, "local") && !checked::to_bool(s.at("local"), label + " local", damaged)) {
      refuse(c10::str("it holds only the stages one process ran (not stage ", k,
                      "): resharding needs every stage's state: load every process's file together "
                      "(load_checkpoint_files)"));
    }
    const int64_t updates = checked::has(s, "updates") ? checked::int_field(s, "updates", damaged + label + " ") : 0;
    if (k == 0) out.updates = updates;
    if (updates != out.updates) {
      refuse(c10::str("its stages made different numbers of updates (stage 0 ", out.updates, ", stage ", k, " ",
                      updates, "; an asynchronous schedule's): resume at ", saved_count, " stages"));
    }
    if (checked::has_value(s, "rng")) refuse("it holds stage-owned random streams (stage_rng), which are per stage");
    if (checked::has_value(s, "optimizer_shard")) {
      refuse(c10::str("it holds one replica's part of stage ", k, "'s optimizer state (sharded): resharding needs ",
                      "the whole state: load the files of every replica together (load_checkpoint_files)"));
    }
    if (!checked::has_value(s, "optimizer")) continue;
    ++with_optimizer;
    const std::string own = damaged + stage_optimizer_label(static_cast<int>(k)) + ": ";
    const Dict o = checked::dict_field(s, "optimizer", damaged);
    const std::string t = checked::to_string(checked::field(o, "type", own), "type", own);
    if (!type.empty() && t != type) refuse(c10::str("its stages' optimizers are of types ", type, " and ", t));
    type = t;
    const List groups = checked::list_field(o, "param_groups", own);
    for (size_t g = 0; g < groups.size(); ++g) {
      const Dict group = checked::to_dict(groups.get(g), c10::str("param_groups[", g, "]"), own);
      const double rate = checked::to_double(checked::field(group, "lr", own), "lr", own);
      const List params = checked::list_field(group, "params", own);
      for (size_t i = 0; i < params.size(); ++i) lr[checked::to_string(params.get(i), "params", own)] = rate;
    }
    const Dict fields = checked::dict_field(o, "state", own);
    for (const auto& entry : fields) state.insert_or_assign(entry.key(), entry.value());
  }
  int target_with_optimizer = 0;
  for (const auto& s : target.stages) target_with_optimizer += s.optimizer ? 1 : 0;
  if (with_optimizer != 0 && with_optimizer != saved_count) refuse("only some of its stages have an optimizer");
  if ((with_optimizer > 0) != (target_with_optimizer > 0)) {
    throw std::invalid_argument(c10::str(what, with_optimizer > 0 ? "holds" : "holds no",
                                         " state of its stages' own optimizers, but this pipeline ",
                                         target_with_optimizer > 0 ? "has" : "has no",
                                         " such optimizers (PipelineOptions::optimizer)"));
  }
  // Each new stage's optimizer: the saved state of the parameters it holds,
  // in its own groups, at the learning rate they were saved with.
  for (int k = 0; k < target.num_stages; ++k) {
    torch::optim::Optimizer* opt = target.stages[k].optimizer;
    if (!target.stages[k].local || !opt) continue;
    const std::string label = stage_optimizer_label(k);
    const ParameterNamer name_of = parameter_namer(target.names, label);
    Dict regrouped = new_dict();
    regrouped.insert("type", type);
    regrouped.insert("stage", int64_t{k});
    List groups = new_list();
    Dict fields = new_dict();
    for (const auto& group : opt->param_groups()) {
      Dict g = new_dict();
      List params = new_list();
      double rate = group.options().get_lr();
      for (const auto& p : group.params()) {
        const std::string name = name_of(p);
        params.push_back(name);
        const auto it = lr.find(name);
        if (it == lr.end()) refuse(c10::str("no saved stage's optimizer held parameter '", name, "'"));
        rate = it->second;
        if (state.contains(name)) fields.insert(name, state.at(name));
      }
      g.insert("lr", rate);
      g.insert("params", params);
      groups.push_back(g);
    }
    regrouped.insert("param_groups", groups);
    regrouped.insert("state", fields);
    out.restore.push_back(
        then_take_shard(optimizer_state_restorer(*opt, regrouped, name_of, damaged + label + ": "), target.stages[k]));
  }
  return out;
}

}  // namespace conveyor
