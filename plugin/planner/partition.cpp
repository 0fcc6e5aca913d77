#include "plugin/planner/partition.h"

#include "plugin/core/errors.h"
#include "plugin/planner/planner.h"
#include "plugin/planner/profile.h"
#include "schedules/generators.h"
#include "schedules/sharding.h"
#include "schedules/validate.h"

#include <c10/util/StringUtil.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace conveyor {

std::vector<int64_t> uniform_boundaries(int64_t num_layers, int num_stages) {
  std::vector<int64_t> boundaries;
  int64_t at = 0;
  for (int k = 0; k + 1 < num_stages; ++k) {
    at += num_layers / num_stages + (k < num_layers % num_stages ? 1 : 0);
    boundaries.push_back(at);
  }
  return boundaries;
}

std::vector<int64_t> balanced_boundaries(const std::vector<double>& costs, int num_stages) {
  const int64_t n = static_cast<int64_t>(costs.size());
  const int k_max = num_stages;
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: smallest achievable max stage cost putting layers [0, i) into k stages.
  std::vector<std::vector<double>> best(k_max + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int64_t>> split(k_max + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= k_max; ++k) {
    for (int64_t i = k; i <= n; ++i) {
      for (int64_t s = k - 1; s < i; ++s) {
        const double cost = std::max(best[k - 1][s], prefix[i] - prefix[s]);
        if (cost < best[k][i]) {
          best[k][i] = cost;
          split[k][i] = s;
        }
      }
    }
  }
  std::vector<int64_t> boundaries(k_max - 1);
  int64_t i = n;
  for (int k = k_max; k > 1; --k) {
    i = split[k][i];
    boundaries[k - 2] = i;
  }
  return boundaries;
}

void check_boundaries(const std::vector<int64_t>& boundaries, int64_t num_layers) {
  int64_t previous = 0;
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const int64_t b = boundaries[i];
    check_argument(b > 0 && b < num_layers, "conveyor: boundary ", i, " is ", b,
                   ", out of range: split points must lie in (0, ", num_layers, ") for a model of ", num_layers,
                   " layers");
    check_argument(i == 0 || b > previous, "conveyor: boundaries must be strictly increasing, but boundary ", i, " (",
                   b, ") follows ", previous);
    previous = b;
  }
}

std::vector<c10::Device> worker_devices(const std::vector<std::string>& names, int num_workers) {
  check_argument(names.size() <= 1 || static_cast<int>(names.size()) == num_workers, "conveyor: ", names.size(),
                 " devices given for ", num_workers, " workers: give one device for all workers or one per worker");
  std::vector<c10::Device> devices;
  for (int k = 0; k < num_workers; ++k) {
    const std::string name = names.empty() ? "cpu" : names.size() == 1 ? names[0] : names[k];
    std::optional<c10::Device> device;
    try {
      device.emplace(name);
    } catch (const std::exception&) {
    }
    check_argument(device && (device->is_cpu() || device->is_cuda()), "conveyor: unknown device '", name,
                   "' for worker ", k, " (expected cpu, cuda or cuda:N)");
    if (device->is_cuda()) {
      const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
      check_argument(visible != 0, "conveyor: worker ", k, " is placed on ", name, " but no CUDA device is available");
      check_argument(device->index() < visible, "conveyor: worker ", k, " is placed on ", name, " but only ", visible,
                     " CUDA device(s) are visible");
      if (!device->has_index()) device.emplace(c10::kCUDA, 0);
    }
    devices.push_back(*device);
  }
  return devices;
}

int chunks_per_worker(const PipelineOptions& options) {
  return options.chunks() > 0 ? options.chunks() : schedules::default_chunks(options.schedule());
}

namespace {

// How many workers (PipelineOptions::workers) and stages (pieces of the
// schedule: workers * chunks) the options ask for.
struct Shape {
  int workers = 1;
  int stages = 1;
};

schedules::Schedule parse_text(const PipelineOptions& options) {
  try {
    return schedules::Schedule::parse(options.schedule_text());
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("conveyor: ") + e.what());
  }
}

Shape resolve_shape(const PipelineOptions& options) {
  const int b = static_cast<int>(options.boundaries().size());
  if (!options.schedule_text().empty()) {
    // The text says how many stages there are and which worker runs each.
    const schedules::Schedule s = parse_text(options);
    check_argument(options.workers() <= 0 || options.workers() == s.num_workers(), "conveyor: the schedule is for ",
                   s.num_workers(), " workers and ", s.num_microbatches, " micro-batches, the pipeline has ",
                   options.workers(), " workers and ", options.microbatches());
    return Shape{s.num_workers(), s.num_stages};
  }
  const int v = chunks_per_worker(options);
  if (options.workers() > 0) {
    const Shape shape{options.workers(), options.workers() * v};
    if (b > 0 && b + 1 != shape.stages) {
      throw std::invalid_argument(c10::str("conveyor: ", b, " boundaries define ", b + 1, " stages, but workers(",
                                           options.workers(), ")", v > 1 ? c10::str(" of ", v, " chunks each") : "",
                                           " was asked for",
                                           v > 1 ? c10::str(": give ", shape.stages - 1, " boundaries") : ""));
    }
    return shape;
  }
  if (b > 0) {
    check_argument((b + 1) % v == 0, "conveyor: ", b, " boundaries define ", b + 1,
                   " stages, which do not make workers of ", v, " chunks each");
    return Shape{(b + 1) / v, b + 1};
  }
  const int workers = options.devices().size() > 1 ? static_cast<int>(options.devices().size()) : 1;
  return Shape{workers, workers * v};
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

}  // namespace

namespace {

// A synchronous schedule's stash, as recompute() and offload() ask.
void declare_stash(const PipelineOptions& options, schedules::Schedule& schedule) {
  if (!options.recompute() && !options.offload()) return;
  const char* what = options.offload() ? "offload" : "recompute";
  if (!schedule.synchronous() && schedule.stash == schedules::Stash::kActivations) {
    throw std::invalid_argument(std::string("conveyor: ") + what + " applies to synchronous schedules; '" +
                                schedule.name + "' keeps each stage's graph and weight versions for its own staleness");
  }
  schedule.stash = options.offload() ? schedules::Stash::kOffload : schedules::Stash::kInputs;
}

// The smallest channel capacity (up to 16) at which `schedule` runs, or 0.
int capacity_needed(const schedules::Schedule& schedule) {
  for (int c = 1; c <= 16; ++c) {
    try {
      schedules::validate(schedule, schedules::ValidateOptions{c, true});
      return c;
    } catch (const std::exception&) {
    }
  }
  return 0;
}

// What a pipeline runs of the sharding actions (schedules/sharding.h):
// REDUCE_GRAD, the replicas' gradient reduction, started where it stands (no
// replicas: nothing to reduce), once per stage and step, or after each
// backward where the gradients are sharded (each reduction writes the reduced
// gradients where the next backward would add to them, unless each replica
// accumulates its pieces); UNSHARD and RESHARD where the parameters are
// sharded.
void check_runnable_sharding(const schedules::Schedule& schedule, ShardLevel level) {
  std::vector<int> reductions(static_cast<size_t>(schedule.num_stages), 0);
  for (size_t w = 0; w < schedule.sharding.size(); ++w) {
    for (const auto& placed : schedule.sharding[w]) {
      const schedules::ShardAction& a = placed.action;
      const bool reduce = a.kind == schedules::ShardKind::kReduceGrad;
      if (reduce && (++reductions.at(static_cast<size_t>(a.stage)) == 1 || level >= ShardLevel::kGradients)) continue;
      if (!reduce && level == ShardLevel::kParameters) continue;
      throw std::invalid_argument(c10::str(
          "conveyor: schedule '", schedule.name, "' has ", a.str(), " on worker ", w, ", which a pipeline does not ",
          "run: ",
          reduce ? "it reduces a stage's gradients once a step, after the stage's last backward, unless they are "
                   "sharded (shard \"gradients\" or \"parameters\", where each replica accumulates its pieces)"
                 : "its stages' parameters stay whole on every replica unless they are sharded (shard \"parameters\")",
          "; the schedule library validates and simulates such schedules (conveyor.schedule_svg)"));
    }
  }
}

}  // namespace

int channel_capacity_for(const PipelineOptions& options) {
  std::string name = options.schedule();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!options.schedule_text().empty() || name != "eager-1f1b") return options.channel_capacity();
  return std::max(options.channel_capacity(), std::max(1, options.lookahead()) + 1);
}

schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages) {
  schedules::Schedule schedule;
  if (options.schedule_text().empty()) {
    const int v = chunks_per_worker(options);
    check_argument(num_stages % v == 0, "conveyor: ", num_stages, " stages do not make workers of ", v,
                   " chunks each");
    try {
      schedule = schedules::make_schedule(options.schedule(), num_stages / v, options.microbatches(),
                                          options.vertical_sync(), v, options.lookahead());
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("conveyor: ") + e.what());
    }
  } else {
    schedule = parse_text(options);
  }
  check_runnable_sharding(schedule, options.shard());
  check_argument(schedule.num_stages == num_stages && schedule.num_microbatches == options.microbatches(),
                 "conveyor: the schedule is for ", schedule.num_stages, " stages and ", schedule.num_microbatches,
                 " micro-batches, the pipeline has ", num_stages, " stages and ", options.microbatches());
  declare_stash(options, schedule);
  try {
    schedules::validate(schedule, schedules::ValidateOptions{channel_capacity_for(options), true});
  } catch (const std::exception& e) {
    std::string hint;
    const int needed = std::string(e.what()).find("deadlocks") != std::string::npos ? capacity_needed(schedule) : 0;
    if (needed > channel_capacity_for(options)) hint = c10::str(" (it runs with channel_capacity(", needed, "))");
    throw std::invalid_argument(
        c10::str("conveyor: schedule '", schedule.name, "' cannot run on this pipeline: ", e.what(), hint));
  }
  return schedule;
}

StageSplit split_stages(const torch::nn::Sequential& model, const PipelineOptions& options,
                      schedules::Schedule* schedule_out) {
  const int64_t num_layers = static_cast<int64_t>(model->size());
  if (num_layers == 0) throw std::invalid_argument("conveyor: the model is empty: a Sequential with no layers");
  const Shape shape = resolve_shape(options);
  const int num_stages = shape.stages;
  check_argument(num_stages <= num_layers, "conveyor: ", num_stages, " stages asked for a model of only ", num_layers,
                 " layers: every stage needs at least one layer");
  std::vector<int64_t> boundaries = options.boundaries();
  if (boundaries.empty()) {
    if (options.balance() == Balance::kTime) {
      if (!options.profile()) {
        throw std::invalid_argument(
            "conveyor: Balance::kTime needs the model's profile: PipelineOptions().profile(std::make_shared<"
            "conveyor::ModelProfile>(conveyor::profile_model(model, inputs, targets, loss_fn)))");
      }
      check_argument(static_cast<int64_t>(options.profile()->layers.size()) == num_layers,
                     "conveyor: the profile describes ", options.profile()->layers.size(), " layers, the model has ",
                     num_layers, ": profile this model");
      boundaries = time_balanced_boundaries(split_costs(*options.profile(), options, num_stages), num_stages);
    } else if (options.balance() == Balance::kParameters) {
      std::vector<double> costs;
      for (const auto& layer : *model) costs.push_back(static_cast<double>(parameter_count(*layer.ptr())));
      boundaries = balanced_boundaries(costs, num_stages);
    } else {
      boundaries = uniform_boundaries(num_layers, num_stages);
    }
  }
  check_boundaries(boundaries, num_layers);
  // One device per worker; a worker's stages (the schedule's placement) share it.
  const std::vector<c10::Device> on_worker = worker_devices(options.devices(), shape.workers);
  schedules::Schedule schedule = build_schedule(options, num_stages);
  std::vector<c10::Device> devices;
  for (int k = 0; k < num_stages; ++k) devices.push_back(on_worker[schedule.worker_of(k)]);
  if (schedule_out) *schedule_out = std::move(schedule);

  StageSplit plan;
  plan.num_layers = num_layers;
  int64_t begin = 0;
  for (int k = 0; k < num_stages; ++k) {
    const int64_t end = k + 1 < num_stages ? boundaries[k] : num_layers;
    plan.stages.push_back(StageSpec{begin, end, devices[k]});
    begin = end;
  }
  return plan;
}

}  // namespace conveyor
