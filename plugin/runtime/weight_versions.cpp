#include "plugin/runtime/weight_versions.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace conveyor {

void WeightVersions::begin(std::vector<int> forward_version, const Stage& stage, const WeightVersion* current) {
  forward_version_ = std::move(forward_version);
  for (int v : forward_version_) ++readers_left_[v];
  if (!readers_left_.count(0)) return;
  if (!current) return keep(0, stage);
  // The same tensors, in a version of its own: held() counts it while its
  // readers hold it, as a copy of its own would be.
  kept_[0] = std::make_shared<WeightVersion>(*current);
  made_.push_back(kept_[0]);
}

std::shared_ptr<WeightVersion> WeightVersions::for_forward(int mb, int updates) {
  const int v = forward_version_.at(mb);
  const auto it = kept_.find(v);
  TORCH_CHECK(it != kept_.end(), "weight version ", v, " is not available (this stage has made ", updates, " updates)");
  std::shared_ptr<WeightVersion> version = it->second;
  if (--readers_left_[v] == 0) kept_.erase(it);
  return version;
}

void WeightVersions::after_update(int n, const Stage& stage) {
  const auto it = readers_left_.find(n);
  if (it != readers_left_.end() && it->second > 0) keep(n, stage);
}

void WeightVersions::keep(int n, const Stage& stage) {
  kept_[n] = stage.snapshot();
  made_.push_back(kept_[n]);
}

int WeightVersions::held() const {
  return static_cast<int>(std::count_if(made_.begin(), made_.end(), [](const auto& w) { return !w.expired(); }));
}

void WeightVersions::note_peak() { peak_ = std::max(peak_, held()); }

}  // namespace conveyor
