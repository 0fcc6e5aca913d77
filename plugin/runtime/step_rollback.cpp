#include "plugin/runtime/step_rollback.h"

#include <torch/serialize/archive.h>

#include <sstream>

namespace conveyor {

void StepRollback::keep(Stage& stage) {
  std::string optimizer;
  if (stage.optimizer()) {
    torch::serialize::OutputArchive archive;
    stage.optimizer()->save(archive);
    std::ostringstream out;
    archive.save_to(out);
    optimizer = out.str();
  }
  saved_.push_back(Saved{&stage, stage.snapshot(), std::move(optimizer), stage.updates()});
}

void StepRollback::keep_random(Stage& stage) {
  if (StageRandom* random = stage.random()) random_.emplace_back(random, random->state());
}

void StepRollback::restore() {
  for (const auto& [random, state] : random_) random->set_state(state);
  for (const Saved& saved : saved_) {
    saved.stage->restore_live(*saved.weights);
    saved.stage->restore_updates(saved.updates);
    if (saved.optimizer.empty()) continue;
    torch::serialize::InputArchive archive;
    std::istringstream in(saved.optimizer);
    archive.load_from(in);
    saved.stage->optimizer()->load(archive);
  }
}

}  // namespace conveyor
