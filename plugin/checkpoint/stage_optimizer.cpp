#include "plugin/checkpoint/stage_optimizer.h"

#include "plugin/checkpoint/checked_ivalue.h"
#include "plugin/checkpoint/checkpoint_values.h"

#include <c10/util/StringUtil.h>

#include <stdexcept>
#include <utility>

namespace conveyor {

std::function<void()> then_take_shard(std::function<void()> restore, const CheckpointTarget::Stage& stage) {
  if (!stage.sharded) return restore;
  return [restore = std::move(restore), sharded = stage.sharded, whole = stage.optimizer] {
    restore();
    sharded->take_shard(*whole);
  };
}

std::function<void()> stage_optimizer_restorer(const checkpoint_values::Dict& saved,
                                               const CheckpointTarget::Stage& stage, int k,
                                               const std::map<const void*, std::string>& names,
                                               const std::string& what, const std::string& damaged) {
  const bool whole = checked::has_value(saved, "optimizer");
  const bool part = checked::has_value(saved, "optimizer_shard");
  if ((stage.optimizer != nullptr) != (whole || part)) {
    throw std::invalid_argument(c10::str(what, whole || part ? "holds" : "holds no", " state of stage ", k,
                                         "'s own optimizer, but this pipeline ", stage.optimizer ? "has" : "has no",
                                         " such optimizer (PipelineOptions::optimizer)"));
  }
  if (!stage.optimizer) return {};
  const std::string own = checkpoint_values::stage_optimizer_label(k);
  const ParameterNamer weight_name = parameter_namer(names, own);
  if (whole) {
    return then_take_shard(optimizer_state_restorer(*stage.optimizer, checked::dict_field(saved, "optimizer", damaged),
                                                    weight_name, damaged + own + ": "),
                           stage);
  }
  const checkpoint_values::Dict shard = checked::dict_field(saved, "optimizer_shard", damaged);
  const std::string where = damaged + own + "'s shard ";
  const int64_t replica = checked::int_field(shard, "replica", where);
  const int64_t replicas = checked::int_field(shard, "replicas", where);
  if (replicas < 1 || replica < 0 || replica >= replicas) {
    throw std::invalid_argument(c10::str(where, "is replica ", replica, " of ", replicas));
  }
  ShardedState* sharded = stage.sharded;
  if (!sharded || sharded->replicas() != replicas || sharded->replica() != replica) {
    const std::string here = sharded ? c10::str("is replica ", sharded->replica(), " of ", sharded->replicas())
                                     : std::string("does not split it (the option shard)");
    throw std::invalid_argument(c10::str(what, "holds replica ", replica, "'s part of stage ", k,
                                         "'s optimizer state, split across ", replicas,
                                         " replicas, but this process ", here,
                                         ": load the files of every replica together (load_checkpoint_files)"));
  }
  const ParameterNamer piece_name = [sharded, weight_name](const at::Tensor& piece) {
    return weight_name(sharded->weight_of_piece(piece));
  };
  std::function<void()> restore = optimizer_state_restorer(
      sharded->shard(), checked::dict_field(shard, "optimizer", where), piece_name, damaged + own + ": ");
  return [restore = std::move(restore), sharded] {
    restore();
    sharded->shard_restored();
  };
}

}  // namespace conveyor
