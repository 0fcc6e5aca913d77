#pragma once
// Counts, on this thread, the calls of the named ops (as the dispatcher
// records them: "aten::lstm", "conveyor::fused_lstm") made while alive.

#include <ATen/record_function.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace conveyor::testing {

class OpCallCounter {
 public:
  explicit OpCallCounter(std::vector<std::string> names) {
    counts().clear();
    for (auto& n : names) counts()[n] = 0;
    handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start).needsInputs(false));
  }
  ~OpCallCounter() { at::removeCallback(handle_); }
  OpCallCounter(const OpCallCounter&) = delete;
  OpCallCounter& operator=(const OpCallCounter&) = delete;

  int calls(const std::string& name) const { return counts().count(name) ? counts().at(name) : 0; }

 private:
  static std::map<std::string, int>& counts() {
    thread_local std::map<std::string, int> c;
    return c;
  }
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const auto it = counts().find(fn.name());
    if (it != counts().end()) ++it->second;
    return nullptr;
  }
  at::CallbackHandle handle_;
};

}  // namespace conveyor::testing
