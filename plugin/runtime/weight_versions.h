#pragma once
// WeightVersions: weight stashing within one step of one stage. The schedule
// says which version (the weights after n of this step's updates) each
// forward reads (schedules::forward_versions); a version is copied when the
// update that makes it is done and some forward will read it, handed to those
// forwards, and dropped from here when the last of them has it (its backward's
// stash entry keeps it until then).

#include "plugin/model/stage.h"

#include <map>
#include <memory>
#include <vector>

namespace conveyor {

class WeightVersions {
 public:
  // Before the step: `forward_version[mb]` for each micro-batch. Copies the
  // current weights when some forward reads version 0, or takes `current`,
  // a copy already made of them.
  void begin(std::vector<int> forward_version, const Stage& stage, const WeightVersion* current = nullptr);
  // The version micro-batch mb's forward reads (`updates`: how many updates
  // the stage has made this step, for the error when it is missing).
  std::shared_ptr<WeightVersion> for_forward(int mb, int updates);
  // After the step's n-th update: copies the weights if a forward reads them.
  void after_update(int n, const Stage& stage);

  // Copies that exist now, here or in stash entries; the most over the step.
  int held() const;
  void note_peak();
  int peak() const { return peak_; }

 private:
  void keep(int n, const Stage& stage);
  std::vector<int> forward_version_;
  std::map<int, int> readers_left_;
  std::map<int, std::shared_ptr<WeightVersion>> kept_;
  std::vector<std::weak_ptr<WeightVersion>> made_;
  int peak_ = 0;
};

}  // namespace conveyor
