// The fused ops' kernels by name, and which one a call runs
// (fused_dispatch.h, "Kernels"): the names, the overrides from the
// environment and from C++, and the table's choice.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/dispatch/fused_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace conveyor {
namespace {

// Each op's kernels, newest first: the one list of their names (fused_dispatch.h, "Kernels").
const std::map<std::string, std::vector<std::string>>& kernels_of_ops() {
  static const std::map<std::string, std::vector<std::string>> kernels{
      {"lstm", {"persistent", "persistent_fma", "v1", "step"}},
      {"attention", {"tiles128", "v1"}},
  };
  return kernels;
}

struct Overrides {
  std::mutex mutex;
  std::optional<std::map<std::string, std::string>> kernels;  // op -> kernel; read from the environment at first use
  std::atomic<uint64_t> generation{0};                        // bumped by every change
};

Overrides& overrides_state() {
  static Overrides o;
  return o;
}

// CONVEYOR_FUSED_KERNEL="op=name,op=name".
std::map<std::string, std::string> kernels_from_environment() {
  std::map<std::string, std::string> kernels;
  const char* text = std::getenv("CONVEYOR_FUSED_KERNEL");
  if (text == nullptr) return kernels;
  std::istringstream in(text);
  for (std::string pair; std::getline(in, pair, ',');) {
    if (pair.find_first_not_of(" ") == std::string::npos) continue;
    const auto eq = pair.find('=');
    const std::string where = "CONVEYOR_FUSED_KERNEL='" + std::string(text) + "'";
    if (eq == std::string::npos) throw std::invalid_argument(where + ": '" + pair + "' is not op=kernel");
    const std::string op = pair.substr(0, eq), name = pair.substr(eq + 1);
    if (!kernels_of_ops().contains(op)) throw std::invalid_argument(where + ": unknown op '" + op + "' (lstm or attention)");
    check_fused_kernel_name(op, name, where);
    kernels[op] = name;
  }
  return kernels;
}

// The overrides, read from the environment first; call with the mutex held.
std::map<std::string, std::string>& kernel_overrides() {
  if (!overrides_state().kernels) overrides_state().kernels = kernels_from_environment();
  return *overrides_state().kernels;
}

}  // namespace

void check_fused_kernel_name(const std::string& op, const std::string& name, const std::string& where) {
  const std::vector<std::string>& names = fused_kernel_names(op);
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  if (names.empty()) throw std::invalid_argument(where + ": " + op + " has one kernel; there is none to name");
  std::string choices;
  for (const auto& n : names) choices += (choices.empty() ? "" : ", ") + n;
  throw std::invalid_argument(where + ": " + op + " has no kernel '" + name + "' (" + choices + ")");
}

uint64_t kernel_overrides_generation() { return overrides_state().generation.load(); }

void forget_kernel_overrides() {
  std::lock_guard<std::mutex> lock(overrides_state().mutex);
  overrides_state().kernels.reset();
  overrides_state().generation++;
}

const std::vector<std::string>& fused_kernel_names(const std::string& op) {
  static const std::vector<std::string> none;
  const auto it = kernels_of_ops().find(op);
  return it == kernels_of_ops().end() ? none : it->second;
}

std::string fused_kernel(const DispatchQuery& query) {
  const std::vector<std::string>& names = fused_kernel_names(query.op);
  if (names.empty()) return "";
  {
    std::lock_guard<std::mutex> lock(overrides_state().mutex);
    const auto& overrides = kernel_overrides();
    const auto it = overrides.find(query.op);
    if (it != overrides.end()) return it->second;
  }
  const auto table = dispatch_table();
  const auto row = table->nearest(query, dispatch_device_name(query.device));
  if (row && !table->rows()[*row].kernel.empty()) return table->rows()[*row].kernel;
  return names.front();
}

void set_fused_kernel(const std::string& op, const std::string& name) {
  if (!name.empty()) check_fused_kernel_name(op, name, "set_fused_kernel");
  std::lock_guard<std::mutex> lock(overrides_state().mutex);
  auto& overrides = kernel_overrides();
  if (name.empty()) {
    overrides.erase(op);
  } else {
    overrides[op] = name;
  }
  overrides_state().generation++;
}

ScopedFusedKernel::ScopedFusedKernel(std::string op, const std::string& name) : op_(std::move(op)) {
  {
    std::lock_guard<std::mutex> lock(overrides_state().mutex);
    const auto& overrides = kernel_overrides();
    const auto it = overrides.find(op_);
    if (it != overrides.end()) previous_ = it->second;
  }
  set_fused_kernel(op_, name);
}

ScopedFusedKernel::~ScopedFusedKernel() { set_fused_kernel(op_, previous_); }

}  // namespace conveyor
