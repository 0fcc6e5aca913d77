#include "ops/dispatch/fused_dispatch.h"
#include "ops/dispatch/fused_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>

#ifdef CONVEYOR_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace conveyor {

// The text of ops/dispatch/fused_dispatch_table.txt, compiled in by CMake.
extern const char* const kBuiltInDispatchTable;

namespace {

constexpr double kMaxRatio = 4.0;  // a row decides only for shapes within 4x of it on every key

const char* path_name(FusedPath path) { return path == FusedPath::kFused ? "fused" : "reference"; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_measurement(const std::string& key) { return key.size() > 3 && key.ends_with("_ms"); }


std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string shape_text(const std::map<std::string, double>& shape) {
  std::string text;
  for (const auto& [key, value] : shape) text += (text.empty() ? "" : " ") + key + "=" + format_number(value);
  return text;
}

DispatchRow parse_row(const std::string& line, const std::string& where) {
  std::istringstream in(line);
  DispatchRow row;
  std::string path;
  if (!(in >> row.op >> row.device >> row.dtype >> path)) {
    throw std::invalid_argument(where + ": expected 'op device dtype path key=value...', got '" + line + "'");
  }
  if (row.op != "lstm" && row.op != "attention") {
    throw std::invalid_argument(where + ": unknown op '" + row.op + "' (lstm or attention)");
  }
  if (row.dtype != "fp64" && row.dtype != "fp32" && row.dtype != "bf16" && row.dtype != "fp16") {
    throw std::invalid_argument(where + ": unknown dtype '" + row.dtype + "' (fp64, fp32, bf16 or fp16)");
  }
  if (path == "fused") {
    row.path = FusedPath::kFused;
  } else if (path == "reference") {
    row.path = FusedPath::kReference;
  } else {
    throw std::invalid_argument(where + ": unknown path '" + path + "' (fused or reference)");
  }
  for (std::string field; in >> field;) {
    const auto eq = field.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw std::invalid_argument(where + ": '" + field + "' is not key=value");
    }
    const std::string key = field.substr(0, eq), text = field.substr(eq + 1);
    if (key == "kernel") {
      check_fused_kernel_name(row.op, text, where);
      row.kernel = text;
      continue;
    }
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0) {
      throw std::invalid_argument(where + ": " + key + " must be a number >= 0, got '" + text + "'");
    }
    (is_measurement(key) ? row.measured : row.shape)[key] = value;
  }
  if (row.shape.empty()) throw std::invalid_argument(where + ": the row names no shape");
  return row;
}

struct State {
  std::mutex mutex;
  std::shared_ptr<const DispatchTable> table;  // null until first use
  std::atomic<int> policy{-1};                 // -1 until first use
  std::atomic<uint64_t> generation{0};  // bumped by every change of the above
};

State& state() {
  static State s;
  return s;
}

DispatchPolicy policy_from_environment() {
  const char* text = std::getenv("CONVEYOR_FUSED_DISPATCH");
  const std::string value = text ? lower(text) : "table";
  if (value.empty() || value == "table") return DispatchPolicy::kTable;
  if (value == "fused") return DispatchPolicy::kFused;
  if (value == "reference") return DispatchPolicy::kReference;
  throw std::invalid_argument("CONVEYOR_FUSED_DISPATCH='" + std::string(text) +
                              "': expected table, fused or reference");
}


void install_table(std::shared_ptr<const DispatchTable> table) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().table = std::move(table);
  state().generation++;
}

}  // namespace

std::string DispatchRow::str() const {
  std::string text = op + " " + device + " " + dtype + " " + path_name(path) + " " + shape_text(shape);
  if (!kernel.empty()) text += " kernel=" + kernel;
  if (!measured.empty()) text += " " + shape_text(measured);
  return text;
}

DispatchTable DispatchTable::parse(const std::string& text, const std::string& origin) {
  DispatchTable table;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line = line.substr(0, line.find('#'));
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    table.add(parse_row(line, origin + " line " + std::to_string(number)));
  }
  return table;
}

DispatchTable DispatchTable::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("dispatch table " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

DispatchTable DispatchTable::built_in() { return parse(kBuiltInDispatchTable, "built-in dispatch table"); }

std::string DispatchTable::str() const {
  std::string text = "# op device dtype path shape... timings...\n";
  for (const auto& row : rows_) text += row.str() + "\n";
  return text;
}

std::optional<size_t> DispatchTable::nearest(const DispatchQuery& query, const std::string& device_name,
                                             std::string* why_none) const {
  const std::string dtype = dispatch_dtype_name(query.dtype);
  const std::string name = dispatch_device_token(device_name);
  std::optional<size_t> best;
  double best_distance = 0, best_worst = 0;
  bool any_device = false;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const DispatchRow& row = rows_[i];
    const bool device_matches = query.device.is_cpu()
                                    ? row.device == "cpu"
                                    : row.device != "cpu" && name.find(lower(row.device)) != std::string::npos;
    if (row.op != query.op || !device_matches || row.dtype != dtype) continue;
    any_device = true;
    double distance = 0, worst = 0;
    bool applies = true;
    for (const auto& [key, value] : query.shape) {
      const auto it = row.shape.find(key);
      const bool exact = std::find(query.exact_keys.begin(), query.exact_keys.end(), key) != query.exact_keys.end();
      if (it == row.shape.end()) {
        applies = !exact || value == 0;  // an exact key a row does not name reads as 0 (mask=0: unmasked)
        if (!applies) break;
        continue;
      }
      if (exact) {
        applies = it->second == value;
        if (!applies) break;
        continue;
      }
      const double d = std::abs(std::log(std::max(it->second, 1e-9) / std::max(value, 1e-9)));
      distance += d;
      worst = std::max(worst, d);
    }
    if (!applies || (best && distance >= best_distance)) continue;
    best = i;
    best_distance = distance;
    best_worst = worst;
  }
  if (best && best_worst > std::log(kMaxRatio) + 1e-12) {
    if (why_none) *why_none = "no measured " + query.op + " shape within 4x of " + shape_text(query.shape);
    return std::nullopt;
  }
  if (!best && why_none) {
    std::string exact;
    for (const auto& key : query.exact_keys) {
      const auto it = query.shape.find(key);
      if (it != query.shape.end()) exact += " " + key + "=" + format_number(it->second);
    }
    *why_none = "no measured " + query.op + " row for " + dtype + " on " + device_name +
                (any_device ? " with" + exact : std::string());
  }
  return best;
}

std::string dispatch_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kDouble:
      return "fp64";
    case c10::kFloat:
      return "fp32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "fp16";
    default:
      throw std::invalid_argument(std::string("fused ops: no dispatch for dtype ") + c10::toString(dtype));
  }
}

std::string dispatch_device_token(const std::string& device_name) {
  std::string token = lower(device_name);
  std::replace(token.begin(), token.end(), ' ', '_');
  return token;
}

std::string dispatch_device_name(const c10::Device& device) {
  if (device.is_cpu()) return "cpu";
#ifdef CONVEYOR_WITH_CUDA
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : at::cuda::current_device();
    return at::cuda::getDeviceProperties(index)->name;
  }
#endif
  return device.str();
}

DispatchPolicy dispatch_policy() {
  int p = state().policy.load();
  if (p < 0) {
    const int from_env = static_cast<int>(policy_from_environment());
    state().policy.compare_exchange_strong(p, from_env);
    p = state().policy.load();
  }
  return static_cast<DispatchPolicy>(p);
}

void set_dispatch_policy(DispatchPolicy policy) {
  state().policy.store(static_cast<int>(policy));
  state().generation++;
}

uint64_t dispatch_generation() { return state().generation.load() + kernel_overrides_generation(); }

void reload_dispatch_settings() {
  state().policy.store(-1);
  install_table(nullptr);
  forget_kernel_overrides();
}


std::shared_ptr<const DispatchTable> dispatch_table() {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (!state().table) {
    const char* path = std::getenv("CONVEYOR_FUSED_DISPATCH_TABLE");
    state().table = std::make_shared<const DispatchTable>(path && *path ? DispatchTable::load(path)
                                                                        : DispatchTable::built_in());
  }
  return state().table;
}

void set_dispatch_table(DispatchTable table) { install_table(std::make_shared<const DispatchTable>(std::move(table))); }

bool has_cuda_kernel(const char* schema) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(schema, "").hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

bool fused_kernel_can_run(bool cuda_kernel, const c10::Device& device, c10::ScalarType dtype) {
  const bool dtype_ok = dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kBFloat16 || dtype == c10::kHalf;
  return dtype_ok && (device.is_cpu() || (device.is_cuda() && cuda_kernel));
}

DispatchChoice choose_fused_path(const DispatchQuery& query, bool fused_can_run) {
  if (!fused_can_run) return {FusedPath::kReference, "the fused kernel cannot run this call"};
  switch (dispatch_policy()) {
    case DispatchPolicy::kFused:
      return {FusedPath::kFused, "policy: fused"};
    case DispatchPolicy::kReference:
      return {FusedPath::kReference, "policy: reference"};
    case DispatchPolicy::kTable:
      break;
  }
  const auto table = dispatch_table();
  std::string why_none;
  const auto row = table->nearest(query, dispatch_device_name(query.device), &why_none);
  if (!row) return {FusedPath::kReference, why_none};
  return {table->rows()[*row].path, "table row " + std::to_string(*row + 1) + " (" + table->rows()[*row].str() + ")"};
}

ScopedDispatch::ScopedDispatch(DispatchPolicy policy, std::optional<DispatchTable> table)
    : policy_(dispatch_policy()), table_(dispatch_table()) {
  set_dispatch_policy(policy);
  if (table) set_dispatch_table(std::move(*table));
}

ScopedDispatch::~ScopedDispatch() {
  set_dispatch_policy(policy_);
  install_table(table_);
}



}  // namespace conveyor
