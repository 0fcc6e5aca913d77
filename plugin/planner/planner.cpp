#include "plugin/planner/planner.h"

#include "plugin/core/errors.h"
#include "plugin/planner/units.h"
#include "plugin/trace/timeline.h"
#include "schedules/stash_memory.h"

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace conveyor {

namespace {

using schedules::Schedule;

// Bytes at n samples of what measured `bytes` at the profile's batch size.
int64_t at_size(const ModelProfile& p, int64_t bytes, int64_t n) { return bytes * n / p.batch_size; }

// The bytes stage [a, b) stashes per micro-batch at the profile's size, as the
// runtime counts them: the graph's grad-requiring inputs and its outputs, or
// the inputs alone when the backward replays the forward.
// Outputs sent over a link that copies them (another process or device) are
// released once sent (PipelineOptions::free_sent_activations).
int64_t stash_entry_bytes(const ModelProfile& p, const Schedule& s, const PipelineOptions& o, int64_t a, int64_t b) {
  if (schedules::replays_forward(s.stash)) return a > 0 ? p.layers[a - 1].output_bytes : p.input_bytes;
  const bool released = o.free_sent_activations() && !s.splits_backward() && p.link.bytes_per_second > 0 &&
                        b < static_cast<int64_t>(p.layers.size());
  return (a > 0 ? p.layers[a - 1].output_grad_bytes : 0) + (released ? 0 : p.layers[b - 1].output_bytes);
}

int64_t weight_bytes(const ModelProfile& p, int64_t a, int64_t b) {
  int64_t total = 0;
  for (int64_t i = a; i < b; ++i) total += p.layers[i].parameter_bytes;
  return total;
}

// Stage k's memory holding [a, b) with micro-batches of `sizes` samples; and
// into `held` (when given), what it keeps per micro-batch in flight (its stash
// entry and the estimate of autograd's), for a worker's total.
void predict_memory(const ModelProfile& p, const Schedule& s, const PipelineOptions& o, int k, int64_t a, int64_t b,
                    const std::vector<int64_t>& sizes, StagePrediction& out, std::vector<int64_t>* held = nullptr) {
  std::vector<std::vector<int64_t>> entries(s.num_stages, std::vector<int64_t>(sizes.size(), 0));
  std::vector<std::vector<int64_t>> ones(s.num_stages, std::vector<int64_t>(sizes.size(), 1));
  const int64_t entry = stash_entry_bytes(p, s, o, a, b);
  for (size_t mb = 0; mb < sizes.size(); ++mb) entries[k][mb] = at_size(p, entry, sizes[mb]);
  out.stash_bytes = schedules::peak_stash_bytes(s, entries)[k];
  out.peak_inflight = static_cast<int>(schedules::peak_stash_bytes(s, ones)[k]);
  const int64_t weights = weight_bytes(p, a, b);
  out.weight_bytes = 2 * weights;
  out.optimizer_bytes = static_cast<int64_t>(o.optimizer_state_per_weight() * static_cast<double>(weights));
  out.weight_version_bytes = s.weight_stashing ? out.peak_inflight * weights : 0;
  int64_t inner = 0;
  for (int64_t i = a; i + 1 < b; ++i) inner += p.layers[i].output_bytes;
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  const bool replays = schedules::replays_forward(s.stash);
  out.activation_bytes = (replays ? 1 : out.peak_inflight) * at_size(p, inner, largest);
  if (held) {
    const int64_t autograd = replays ? 0 : at_size(p, inner, largest);
    held->clear();
    for (const int64_t size : sizes) held->push_back(at_size(p, entry, size) + autograd);
  }
  if (s.stash == schedules::Stash::kOffload && !p.host_link.kind.empty()) {
    const int64_t on_device = std::min(out.peak_inflight, 2) * at_size(p, entry, largest);
    out.offloaded_bytes = std::max<int64_t>(0, out.stash_bytes - on_device);
    out.host_copy_seconds = p.host_link.seconds(at_size(p, entry, largest));
  }
}

double layer_seconds(const ModelProfile& p, size_t i, double n) {
  return p.forward_seconds(i, n) + p.backward_seconds(i, n) + (i + 1 == p.layers.size() ? p.loss_seconds(n) : 0.0);
}

std::vector<int64_t> budgets_for(const PipelineOptions& o, int num_stages) {
  const auto& b = o.memory_budgets();
  if (b.empty()) return {};
  if (b.size() == 1) return std::vector<int64_t>(num_stages, b[0]);
  check_argument(static_cast<int>(b.size()) == num_stages, "conveyor: ", b.size(), " memory budgets given for ",
                 num_stages, " stages: give one for every stage or one per stage");
  return b;
}

}  // namespace

SplitCosts split_costs(const ModelProfile& p, const PipelineOptions& o, int num_stages) {
  SplitCosts c;
  c.num_layers = static_cast<int64_t>(p.layers.size());
  c.seconds = [&p](int, int64_t a, int64_t b) {
    double t = 0;
    for (int64_t i = a; i < b; ++i) t += layer_seconds(p, i, static_cast<double>(p.batch_size));
    if (b < static_cast<int64_t>(p.layers.size())) t += p.link.seconds(p.layers[b - 1].output_bytes);
    if (a > 0) t += p.link.seconds(p.layers[a - 1].output_grad_bytes);
    return t;
  };
  c.budgets = budgets_for(o, num_stages);
  if (!c.budgets.empty()) {
    auto schedule = std::make_shared<Schedule>(build_schedule(o, num_stages));
    c.bytes = [&p, &o, schedule](int k, int64_t a, int64_t b) {
      StagePrediction s;
      predict_memory(p, *schedule, o, k, a, b, std::vector<int64_t>(schedule->num_microbatches, p.batch_size), s);
      return s.peak_bytes();
    };
  }
  c.atomic_groups = o.atomic_groups();
  for (const auto& l : p.layers) c.layer_names.push_back(l.name);
  return c;
}

// Per worker: its stages' peaks summed, except that a worker of several
// stages (two chunks of a V, or interleaved) holds their in-flight
// micro-batches at most as its line's order has them at once, which is less
// where the stages' peaks come at different times. Offloaded stashes keep the
// sum (what waits in host memory is counted per stage).
std::vector<int64_t> worker_bytes(const Schedule& s, const std::vector<StagePrediction>& predicted,
                                  const std::vector<std::vector<int64_t>>& held) {
  std::vector<int64_t> out(static_cast<size_t>(s.num_workers()), 0), fixed = out;
  std::vector<int> stages(out.size(), 0);
  bool offloaded = false;
  for (size_t k = 0; k < predicted.size(); ++k) {
    const auto w = static_cast<size_t>(s.worker_of(static_cast<int>(k)));
    const StagePrediction& sp = predicted[k];
    out[w] += sp.peak_bytes();
    const bool replays = schedules::replays_forward(s.stash);  // its activations are one micro-batch's, fixed
    fixed[w] += sp.peak_bytes() - sp.stash_bytes - (replays ? 0 : sp.activation_bytes);
    ++stages[w];
    offloaded = offloaded || sp.offloaded_bytes > 0;
  }
  if (offloaded) return out;
  const std::vector<int64_t> together = schedules::peak_worker_stash_bytes(s, held);
  for (size_t w = 0; w < out.size(); ++w) {
    if (stages[w] > 1) out[w] = fixed[w] + together[w];
  }
  return out;
}

Prediction predict_step(const ModelProfile& p, const StageSplit& stages, const Schedule& s, int64_t batch,
             const PipelineOptions& o) {
  const int num = static_cast<int>(stages.stages.size());
  check_argument(s.num_stages == num, "conveyor: the schedule has ", s.num_stages, " stages, the plan ", num);
  check_argument(stages.num_layers == static_cast<int64_t>(p.layers.size()), "conveyor: the profile describes ",
                 p.layers.size(), " layers, the plan ", stages.num_layers);
  check_argument(batch >= s.num_microbatches, "conveyor: a batch of ", batch, " samples cannot make ",
                 s.num_microbatches, " micro-batches");
  Prediction plan;
  plan.split = stages;
  plan.schedule = s;
  plan.batch_size = batch;
  const std::vector<int64_t> sizes = schedules::microbatch_sizes(batch, s.num_microbatches);
  const double n = static_cast<double>(batch) / s.num_microbatches;
  const double scale = n / static_cast<double>(p.batch_size);
  // Workers that share the profiled CPU share its cores: slower while others
  // run, as measured, or (not measured) waiting for a free core; crowded
  // beyond the cores, each action pays a crowded worker's overhead.
  bool shared_cpu = p.cores > 0;
  for (const auto& spec : stages.stages) shared_cpu = shared_cpu && spec.device.is_cpu();
  const bool crowded = shared_cpu && s.num_workers() > p.cores && p.crowded_action_overhead_seconds > 0;
  const double overhead = crowded ? p.crowded_action_overhead_seconds : p.action_overhead_seconds;
  // Workers that keep every core busy pay a transfer's processor time out of
  // their compute: half on the sending stage, half on the receiving one.
  const bool busy_cores = shared_cpu && s.num_workers() >= p.cores;
  const auto message = [&](int64_t layer, bool gradient) {
    if (!busy_cores || p.link.cpu_seconds_per_transfer <= 0) return 0.0;
    const int64_t bytes = gradient ? p.layers[layer].output_grad_bytes : p.layers[layer].output_bytes;
    return p.link.cpu_seconds(static_cast<int64_t>(static_cast<double>(bytes) * scale)) / 2;
  };
  schedules::StageCosts costs;
  bool split_measured = true;  // every layer's I and W (else half the backward each)
  const bool guard = divergence_guarded(o.divergence_guard(), o.loss_scaling().has_value());
  // An asynchronous step first keeps every stage's weights, to roll back to.
  double rollback_copy = 0;
  std::vector<std::vector<int64_t>> held(num);  // per stage and micro-batch, for the workers' totals
  for (int k = 0; k < num; ++k) {
    const StageSpec& spec = stages.stages[k];
    StagePrediction sp;
    sp.begin = spec.begin;
    sp.end = spec.end;
    double input = 0, weight = 0;  // the split backward's I and W
    for (int64_t i = spec.begin; i < spec.end; ++i) {
      sp.forward_seconds += p.forward_seconds(i, n);
      sp.backward_seconds += p.backward_seconds(i, n);
      // An update: the optimizer's step, the divergence guard's check of
      // the gradients, and under weight stashing the new version's copy.
      const LayerProfile& l = p.layers[i];
      sp.update_seconds += (o.optimizer() ? l.update_seconds : 0.0) + (guard ? l.check_seconds : 0.0) +
                           (s.weight_stashing ? l.copy_seconds : 0.0);
      rollback_copy += s.step_per_microbatch ? l.copy_seconds : 0.0;
      input += p.input_backward_seconds(i, n);
      weight += p.weight_backward_seconds(i, n);
      split_measured = split_measured && p.layers[i].input_backward_seconds + p.layers[i].weight_backward_seconds > 0;
    }
    if (k + 1 == num) {
      sp.forward_seconds += p.loss_forward_seconds * scale;
      sp.backward_seconds += p.loss_backward_seconds * scale;
      input += p.loss_backward_seconds * scale;
    } else {
      sp.transfer_seconds =
          p.link.seconds(static_cast<int64_t>(static_cast<double>(p.layers[spec.end - 1].output_bytes) * scale));
      costs.transfers.push_back(sp.transfer_seconds);
    }
    predict_memory(p, s, o, k, spec.begin, spec.end, sizes, sp, &held[k]);
    // A forward receives its inputs and sends its outputs, a backward (or a
    // split backward's I) receives and sends the gradients.
    const bool first = k == 0, last = k + 1 == num;
    const auto messages = [&](bool gradient) {
      return (first ? 0.0 : message(spec.begin - 1, gradient)) + (last ? 0.0 : message(spec.end - 1, gradient));
    };
    const double forward_messages = messages(false), backward_messages = messages(true);
    sp.forward_seconds += overhead + forward_messages;
    sp.backward_seconds += overhead + backward_messages;
    input += backward_messages;
    // An offloaded entry goes out after its forward and comes back during the
    // action before its backward, on a side stream beside the compute (the
    // forward, its replay and the backward): the backward waits for copies
    // that take longer.
    sp.backward_seconds +=
        std::max(0.0, 2 * sp.host_copy_seconds - (2 * sp.forward_seconds + sp.backward_seconds));
    if (s.step_per_microbatch) {
      sp.backward_seconds += sp.update_seconds;  // each backward is followed by the stage's step
    } else {
      plan.update_seconds = std::max(plan.update_seconds, sp.update_seconds);
    }
    costs.forward.push_back(sp.forward_seconds);
    costs.backward.push_back(sp.backward_seconds);
    // I and W are actions of their own, each with the runtime's cost.
    costs.input.push_back(input + overhead);
    costs.weight.push_back(weight + overhead);
    plan.predicted.push_back(sp);
  }
  plan.worker_bytes = worker_bytes(s, plan.predicted, held);
  if (!split_measured) costs.input.clear(), costs.weight.clear();
  plan.update_seconds += rollback_copy;
  if (shared_cpu && s.num_workers() > 1 && !p.slowdown.empty()) {
    costs.slowdown = p.slowdown;
  } else if (shared_cpu && s.num_workers() > p.cores) {
    costs.cores = p.cores;
  }
  plan.simulation = schedules::simulate(s, costs);
  plan.costs = std::move(costs);

  double slowest_stage = 0, model = 0, slowest_layer = 0;
  size_t which = 0;
  for (const auto& sp : plan.predicted) {
    slowest_stage = std::max(slowest_stage, sp.forward_seconds + sp.backward_seconds);
  }
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const double t = layer_seconds(p, i, n);
    model += t;
    if (t > slowest_layer) slowest_layer = t, which = i;
  }
  // "Alone": the slowest stage is mostly this layer, so no other split could do much better.
  if (num > 1 && slowest_layer >= 0.8 * slowest_stage) {
    plan.bound = SpeedBound{static_cast<int64_t>(which), p.layers[which].name, slowest_layer, model};
  }
  return plan;
}

Prediction predict_step(const torch::nn::Sequential& model, const PipelineOptions& o, int64_t batch) {
  if (!o.profile()) {
    throw std::invalid_argument("conveyor: predict_step needs the model's profile (PipelineOptions::profile)");
  }
  const StageSplit stages = split_stages(model, o);
  const Schedule schedule = build_schedule(o, static_cast<int>(stages.stages.size()));
  Prediction plan = predict_step(*o.profile(), stages, schedule, batch, o);
  const char* names[] = {"uniform", "parameters", "time"};
  plan.balance = o.boundaries().empty() ? names[static_cast<int>(o.balance())] : "given boundaries";
  return plan;
}

std::string Prediction::str() const {
  std::ostringstream os;
  const int64_t n = batch_size / std::max(1, schedule.num_microbatches);
  os << "plan (balance: " << balance << "): " << predicted.size() << " stages, schedule " << schedule.name << ", "
     << schedule.num_microbatches << " micro-batches of " << n << (batch_size % schedule.num_microbatches ? "+" : "")
     << " samples\n";
  for (size_t k = 0; k < predicted.size(); ++k) {
    const StagePrediction& s = predicted[k];
    os << "  stage " << k << " on " << split.stages[k].device << ": layers [" << s.begin << ", " << s.end
       << "): per micro-batch forward " << ms(s.forward_seconds) << ", backward " << ms(s.backward_seconds);
    if (k + 1 < predicted.size()) os << ", send " << ms(s.transfer_seconds);
    if (s.update_seconds > 0) {
      os << (schedule.step_per_microbatch ? " (with its update " : ", update ") << ms(s.update_seconds)
         << (schedule.step_per_microbatch ? ")" : "");
    }
    os << "; busy " << ms(simulation.stage_busy[k]) << " a step; memory " << mib(s.peak_bytes()) << " (weights+grads "
       << mib(s.weight_bytes) << ", in flight " << s.peak_inflight << ": stash " << mib(s.stash_bytes);
    if (s.offloaded_bytes > 0) os << " of which " << mib(s.offloaded_bytes) << " in host memory";
    os << ", activations ~" << mib(s.activation_bytes) << ")\n";
  }
  os << "  predicted step " << ms(step_seconds());
  if (update_seconds > 0) {
    os << (schedule.step_per_microbatch ? " (the stages' weights kept first to roll back to included)"
                                        : " (the slowest stage's update after the flush included)");
  }
  os << ", bubble " << percent(bubble_fraction()) << "\n";
  if (bound) {
    os << std::fixed << std::setprecision(2) << "  layer " << bound->layer << " alone bounds the speed: it takes "
       << ms(bound->seconds) << " of the slowest stage's per micro-batch; no split can beat that, so the best "
       << "speed-up any split can give over one device is " << bound->best_speedup() << "x (the model takes "
       << ms(bound->model_seconds) << "): " << bound->name << "\n";
  }
  return os.str();
}

std::string Prediction::versus(const StepResult& r) const {
  std::ostringstream os;
  const auto diff = [](double predicted, double measured) {
    std::ostringstream d;
    d << std::showpos << std::fixed << std::setprecision(1) << 100 * (predicted / measured - 1) << "%";
    return d.str();
  };
  os << "predicted vs measured: step " << ms(step_seconds()) << " vs " << ms(r.wall_seconds) << " ("
     << diff(step_seconds(), r.wall_seconds) << "), bubble " << percent(bubble_fraction()) << " vs "
     << percent(r.bubble_fraction) << "\n";
  for (size_t k = 0; k < predicted.size() && k < r.busy_seconds.size(); ++k) {
    os << "  stage " << k << ": busy " << ms(simulation.stage_busy[k]) << " vs " << ms(r.busy_seconds[k]);
    if (k < r.peak_stash_bytes.size()) {
      os << "; peak stash " << predicted[k].stash_bytes << " vs " << r.peak_stash_bytes[k] << " bytes";
    }
    os << "\n";
  }
  return os.str();
}

void Prediction::write_timeline(const std::string& path, const StepResult* measured) const {
  std::vector<TimelineBlock> blocks = {
      timeline_block(simulation, "predicted: " + ms(step_seconds()) + ", bubble " + percent(bubble_fraction()))};
  if (measured) {
    blocks.push_back(timeline_block(*measured, "measured: " + ms(measured->wall_seconds) + ", bubble " +
                                                   percent(measured->bubble_fraction)));
  }
  conveyor::write_timeline(path, blocks);
}

}  // namespace conveyor
