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

int resolve_num_stages(const PipelineOptions& options) {
  if (options.stages() < 0) {
    throw std::invalid_argument("conveyor: the number of stages must be positive, got " +
                                std::to_string(options.stages()));
  }
  if (options.stages() > 0) {
    if (!options.boundaries().empty() && options.boundaries().size() + 1 != static_cast<size_t>(options.stages())) {
      throw std::invalid_argument("conveyor: " + std::to_string(options.boundaries().size()) + " boundaries define " +
                                  std::to_string(options.boundaries().size() + 1) + " stages, but stages(" +
                                  std::to_string(options.stages()) + ") was asked for");
    }
    return options.stages();
  }
  if (!options.boundaries().empty()) return static_cast<int>(options.boundaries().size()) + 1;
  if (options.devices().size() > 1) return static_cast<int>(options.devices().size());
  return 1;
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

}  // namespace

schedules::Schedule build_schedule(const PipelineOptions& options, int num_stages) {
  if (options.microbatches() < 1) {
    throw std::invalid_argument("conveyor: microbatches must be at least 1, got " +
                                std::to_string(options.microbatches()));
  }
  schedules::Schedule schedule;
  try {
    if (options.schedule_text().empty()) {
      schedule =
          schedules::make_schedule(options.schedule(), num_stages, options.microbatches(), options.vertical_sync());
    } else {
      schedule = schedules::Schedule::parse(options.schedule_text());
    }
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("conveyor: ") + e.what());
  }
  if (schedule.num_stages != num_stages || schedule.num_microbatches != options.microbatches()) {
    std::ostringstream os;
    os << "conveyor: the schedule is for " << schedule.num_stages << " stages and " << schedule.num_microbatches
       << " micro-batches, the pipeline has " << num_stages << " stages and " << options.microbatches();
    throw std::invalid_argument(os.str());
  }
  try {
    schedules::validate(schedule, schedules::ValidateOptions{options.channel_capacity(), true});
  } catch (const std::exception& e) {
    throw std::invalid_argument("conveyor: schedule '" + schedule.name + "' cannot run on this pipeline: " + e.what());
  }
  return schedule;
}

StagePlan plan_stages(const torch::nn::Sequential& model, const PipelineOptions& options) {
  const int64_t num_layers = static_cast<int64_t>(model->size());
  if (num_layers == 0) throw std::invalid_argument("conveyor: the model is empty: a Sequential with no layers");
  const int num_stages = resolve_num_stages(options);
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
  const std::vector<c10::Device> devices = stage_devices(options.devices(), num_stages);

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
