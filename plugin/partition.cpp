#include "plugin/partition.h"

#include "plugin/planner.h"
#include "plugin/profile.h"
#include "schedules/generators.h"
#include "schedules/validate.h"

#include <torch/cuda.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace conveyor {

std::string StagePlan::str() const {
  std::ostringstream os;
  for (size_t k = 0; k < stages.size(); ++k) {
    if (k) os << "; ";
    os << "stage " << k << ": layers [" << stages[k].begin << ", " << stages[k].end << ") on " << stages[k].device;
  }
  return os.str();
}

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
    if (b <= 0 || b >= num_layers) {
      std::ostringstream os;
      os << "conveyor: boundary " << i << " is " << b << ", out of range: split points must lie in (0, " << num_layers
         << ") for a model of " << num_layers << " layers";
      throw std::invalid_argument(os.str());
    }
    if (i > 0 && b <= previous) {
      std::ostringstream os;
      os << "conveyor: boundaries must be strictly increasing, but boundary " << i << " (" << b << ") follows "
         << previous;
      throw std::invalid_argument(os.str());
    }
    previous = b;
  }
}

std::vector<c10::Device> stage_devices(const std::vector<std::string>& names, int num_stages) {
  if (names.size() > 1 && static_cast<int>(names.size()) != num_stages) {
    std::ostringstream os;
    os << "conveyor: " << names.size() << " devices given for " << num_stages
       << " stages: give one device for all stages or one per stage";
    throw std::invalid_argument(os.str());
  }
  std::vector<c10::Device> devices;
  for (int k = 0; k < num_stages; ++k) {
    const std::string name = names.empty() ? "cpu" : names.size() == 1 ? names[0] : names[k];
    std::optional<c10::Device> device;
    try {
      device.emplace(name);
    } catch (const std::exception&) {
    }
    if (!device || !(device->is_cpu() || device->is_cuda())) {
      throw std::invalid_argument("conveyor: unknown device '" + name + "' for stage " + std::to_string(k) +
                                  " (expected cpu, cuda or cuda:N)");
    }
    if (device->is_cuda()) {
      const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
      if (visible == 0) {
        throw std::invalid_argument("conveyor: stage " + std::to_string(k) + " is placed on " + name +
                                    " but no CUDA device is available");
      }
      if (device->index() >= visible) {
        throw std::invalid_argument("conveyor: stage " + std::to_string(k) + " is placed on " + name + " but only " +
                                    std::to_string(visible) + " CUDA device(s) are visible");
      }
      if (!device->has_index()) device.emplace(c10::kCUDA, 0);
    }
    devices.push_back(*device);
  }
  return devices;
}

namespace {

// How many workers (PipelineOptions::stages) and pieces (stages of the
// schedule: workers * chunks) the options ask for.
struct Shape {
  int workers = 1;
  int pieces = 1;
};

schedules::Schedule parse_text(const PipelineOptions& options) {
  try {
    return schedules::Schedule::parse(options.schedule_text());
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("conveyor: ") + e.what());
  }
}

Shape resolve_shape(const PipelineOptions& options) {
  if (options.stages() < 0) {
    throw std::invalid_argument("conveyor: the number of stages must be positive, got " +
                                std::to_string(options.stages()));
  }
  if (options.chunks() < 0) {
    throw std::invalid_argument("conveyor: the number of chunks per stage must be positive, got " +
                                std::to_string(options.chunks()));
  }
  const int b = static_cast<int>(options.boundaries().size());
  if (!options.schedule_text().empty()) {
    // The text says how many pieces there are and which stage runs each.
    const schedules::Schedule s = parse_text(options);
    if (options.stages() > 0 && options.stages() != s.num_workers()) {
      std::ostringstream os;
      os << "conveyor: the schedule is for " << s.num_workers() << " stages and " << s.num_microbatches
         << " micro-batches, the pipeline has " << options.stages() << " stages and " << options.microbatches();
      throw std::invalid_argument(os.str());
    }
    return Shape{s.num_workers(), s.num_stages};
  }
  const int v = options.chunks() > 0 ? options.chunks() : (schedules::is_interleaved(options.schedule()) ? 2 : 1);
  if (options.stages() > 0) {
    const Shape shape{options.stages(), options.stages() * v};
    if (b > 0 && b + 1 != shape.pieces) {
      throw std::invalid_argument("conveyor: " + std::to_string(b) + " boundaries define " + std::to_string(b + 1) +
                                  " stages, but stages(" + std::to_string(options.stages()) + ")" +
                                  (v > 1 ? " of " + std::to_string(v) + " chunks each" : "") + " was asked for" +
                                  (v > 1 ? ": give " + std::to_string(shape.pieces - 1) + " boundaries" : ""));
    }
    return shape;
  }
  if (b > 0) {
    if ((b + 1) % v != 0) {
      throw std::invalid_argument("conveyor: " + std::to_string(b) + " boundaries define " + std::to_string(b + 1) +
                                  " pieces, which do not make stages of " + std::to_string(v) + " chunks each");
    }
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

}  // namespace

schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages) {
  if (options.microbatches() < 1) {
    throw std::invalid_argument("conveyor: microbatches must be at least 1, got " +
                                std::to_string(options.microbatches()));
  }
  schedules::Schedule schedule;
  if (options.schedule_text().empty()) {
    const int v = options.chunks() > 0 ? options.chunks() : (schedules::is_interleaved(options.schedule()) ? 2 : 1);
    if (num_stages % v != 0) {
      throw std::invalid_argument("conveyor: " + std::to_string(num_stages) + " pieces do not make stages of " +
                                  std::to_string(v) + " chunks each");
    }
    try {
      schedule = schedules::make_schedule(options.schedule(), num_stages / v, options.microbatches(),
                                          options.vertical_sync(), v);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("conveyor: ") + e.what());
    }
  } else {
    schedule = parse_text(options);
  }
  if (schedule.num_stages != num_stages || schedule.num_microbatches != options.microbatches()) {
    std::ostringstream os;
    os << "conveyor: the schedule is for " << schedule.num_stages << " stages and " << schedule.num_microbatches
       << " micro-batches, the pipeline has " << num_stages << " stages and " << options.microbatches();
    throw std::invalid_argument(os.str());
  }
  declare_stash(options, schedule);
  try {
    schedules::validate(schedule, schedules::ValidateOptions{options.channel_capacity(), true});
  } catch (const std::exception& e) {
    std::string hint;
    const int needed = std::string(e.what()).find("deadlocks") != std::string::npos ? capacity_needed(schedule) : 0;
    if (needed > options.channel_capacity()) hint = " (it runs with channel_capacity(" + std::to_string(needed) + "))";
    throw std::invalid_argument("conveyor: schedule '" + schedule.name + "' cannot run on this pipeline: " + e.what() +
                                hint);
  }
  return schedule;
}

StagePlan plan_stages(const torch::nn::Sequential& model, const PipelineOptions& options) {
  const int64_t num_layers = static_cast<int64_t>(model->size());
  if (num_layers == 0) throw std::invalid_argument("conveyor: the model is empty: a Sequential with no layers");
  const Shape shape = resolve_shape(options);
  const int num_stages = shape.pieces;
  if (num_stages > num_layers) {
    throw std::invalid_argument("conveyor: " + std::to_string(num_stages) + " stages asked for a model of only " +
                                std::to_string(num_layers) + " layers: every stage needs at least one layer");
  }
  std::vector<int64_t> boundaries = options.boundaries();
  if (boundaries.empty()) {
    if (options.balance() == Balance::kTime) {
      if (!options.profile()) {
        throw std::invalid_argument(
            "conveyor: Balance::kTime needs the model's profile: PipelineOptions().profile(std::make_shared<"
            "conveyor::ModelProfile>(conveyor::profile_model(model, inputs, targets, loss_fn)))");
      }
      if (static_cast<int64_t>(options.profile()->layers.size()) != num_layers) {
        throw std::invalid_argument("conveyor: the profile describes " +
                                    std::to_string(options.profile()->layers.size()) + " layers, the model has " +
                                    std::to_string(num_layers) + ": profile this model");
      }
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
  // One device per worker; a worker's pieces (the schedule's placement) share it.
  const std::vector<c10::Device> worker_devices = stage_devices(options.devices(), shape.workers);
  const schedules::Schedule schedule = build_schedule(options, num_stages);
  std::vector<c10::Device> devices;
  for (int k = 0; k < num_stages; ++k) devices.push_back(worker_devices[schedule.worker_of(k)]);

  StagePlan plan;
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
