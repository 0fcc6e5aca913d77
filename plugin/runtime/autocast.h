#pragma once
// AutocastScope: a stage's forward under autocast to one dtype on the stage's
// device type, as `with torch.autocast(device_type, dtype, cache_enabled=False)`
// would run it. Autocast's cache of weights cast to the low dtype is one map
// for the whole process, and clear_cache() empties it for every thread: the
// worker threads would clear each other's entries mid-forward, and with
// weight stashing a cached cast could outlive the version it was made from.
// So the scope turns the (thread-local) cache off for its worker instead.

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace conveyor {

class AutocastScope {
 public:
  AutocastScope(c10::DeviceType device, std::optional<c10::ScalarType> dtype) : device_(device), on_(dtype) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(device_);
    was_dtype_ = at::autocast::get_autocast_dtype(device_);
    at::autocast::set_autocast_enabled(device_, true);
    at::autocast::set_autocast_dtype(device_, *dtype);
    was_caching_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastScope() {
    if (!on_) return;
    at::autocast::set_autocast_cache_enabled(was_caching_);
    at::autocast::set_autocast_enabled(device_, was_enabled_);
    at::autocast::set_autocast_dtype(device_, was_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType device_;
  bool on_;
  bool was_enabled_ = false;
  bool was_caching_ = true;
  c10::ScalarType was_dtype_ = c10::ScalarType::Undefined;
};

}  // namespace conveyor
