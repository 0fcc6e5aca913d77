#pragma once
// Every option of a pipeline, declared once: its section, type, name,
// default, bound and documentation, in one row of the lists below. From these
// rows come the fields of each section (the runtime takes its sections as
// they are), PipelineOptions' builder methods (plugin/core/options.h), the Python
// keywords with their types, defaults and help (python/conveyor), the
// TorchScript class's dictionary keys, the bounds every value is checked
// against, and the manual's option reference (docs/reference/options.md).
//
// A row is X(section, Type, name, default, bound, documentation). The
// documentation speaks of values as Python passes them ("uniform"); C++
// passes the enumerator (Balance::kUniform). Adding an option is one row here
// and its use.

#include "plugin/core/option_rows.h"
#include "plugin/core/types.h"
#include "schedules/sharding.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/StringUtil.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace conveyor {

struct ModelProfile;  // plugin/planner/profile.h

// How a model is cut into stages when no boundaries are given.
enum class Balance { kUniform, kParameters, kTime };
// How the loss function reduces over a micro-batch.
enum class LossReduction { kMean, kSum };
// What a learning-rate schedule's update count counts.
enum class UpdateUnit { kBatch, kMicrobatch };
// What a stage's replicas shard (the option shard), as the schedule library
// names the levels.
using ShardLevel = schedules::ShardLevel;

// Each enumeration's values by name, in the enumerators' order: how Python and
// the documentation spell them.
constexpr std::array<const char*, 3> value_names(Balance) { return {"uniform", "parameters", "time"}; }
constexpr std::array<const char*, 2> value_names(LossReduction) { return {"mean", "sum"}; }
constexpr std::array<const char*, 2> value_names(UpdateUnit) { return {"batch", "microbatch"}; }
// One value's name.
template <typename E>
constexpr const char* value_name(E e) {
  return value_names(e)[static_cast<size_t>(e)];
}

// Makes one stage's optimizer over that stage's live weights, e.g.
//   [](std::vector<at::Tensor> p) { return std::make_unique<torch::optim::SGD>(p, 0.1); }
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// The optimizers the pipeline can make by name (torch.optim's).
enum class OptimizerName { kSgd, kAdam, kAdamW };
constexpr std::array<const char*, 3> value_names(OptimizerName) { return {"sgd", "adam", "adamw"}; }

// The pipeline's own optimizer, the value of the option `optimizer`: none,
// one of torch.optim's by name (its learning rate and the rest are options
// of their own), or a factory.
struct OptimizerSpec {
  OptimizerSpec() = default;
  OptimizerSpec(std::nullptr_t) {}  // NOLINT: none, as for a factory
  OptimizerSpec(OptimizerName n) : name(n) {}  // NOLINT: implicit, as the option is set
  template <typename F>
    requires(std::is_constructible_v<OptimizerFactory, F> && !std::is_same_v<std::decay_t<F>, OptimizerSpec> &&
             !std::is_same_v<std::decay_t<F>, std::nullptr_t>)
  OptimizerSpec(F&& f) : factory(std::forward<F>(f)) {}  // NOLINT
  std::optional<OptimizerName> name;
  OptimizerFactory factory;
  explicit operator bool() const { return name.has_value() || static_cast<bool>(factory); }
  bool operator==(std::nullptr_t) const { return !*this; }
};

// The learning rate of the n-th update (n counts from 0).
using LearningRateSchedule = std::function<double(int64_t update)>;

#define CONVEYOR_LOSS_SCALING_FIELDS(X)                                                                         \
  X(loss_scaling, double, init_scale, 65536.0, finite(kPositive), "the scale of the first step")                 \
  X(loss_scaling, double, growth_factor, 2.0, more_than(1), "multiplies the scale after growth_interval clean "  \
    "updates in a row")                                                                                         \
  X(loss_scaling, double, backoff_factor, 0.5, open_interval(0, 1), "multiplies the scale after an update that " \
    "overflowed")                                                                                               \
  X(loss_scaling, int64_t, growth_interval, 2000, at_least(1), "clean updates in a row before the scale grows")

// Dynamic loss scaling, with the semantics of torch.amp.GradScaler: each
// micro-batch's loss is multiplied by the scale before its backward; an
// update whose gradients hold an inf or NaN is skipped and the scale
// multiplied by backoff_factor; after growth_interval clean updates in a row
// it is multiplied by growth_factor. Clean gradients are divided by the scale
// before they are clipped and stepped.
struct LossScaling {
  CONVEYOR_LOSS_SCALING_FIELDS(CONVEYOR_OPTION_ARG)
};
CONVEYOR_FOR_EACH_OPTION(LossScaling, CONVEYOR_LOSS_SCALING_FIELDS)

// --- what to cut ----------------------------------------------------------------------------------------------
#define CONVEYOR_CUTTING_OPTIONS(X)                                                                                \
  X(cutting, std::vector<std::string>, split_points, {}, kAny,                                                     \
    "Submodule names whose calls begin a new stage ([\"layers.2\", \"head\"]: three stages). Without them the "    \
    "forward must be a plain chain of submodules, cut into workers stages by balance.")                            \
  X(cutting, std::vector<int64_t>, boundaries, {}, kAny,                                                           \
    "Explicit cuts of a sequence of layers: the index of the first layer of stages 1..S-1, strictly increasing, "  \
    "each in (0, number of layers). Overrides balance.")                                                           \
  X(cutting, Balance, balance, Balance::kUniform, kAny,                                                            \
    "How the layers are cut when no cuts are given: \"uniform\" (the same number of layers per stage, earlier "    \
    "stages taking the remainder), \"parameters\" (the largest stage's parameter count as small as possible) or "  \
    "\"time\" (the slowest stage, with its transfers, as fast as possible within memory_budgets; needs a "         \
    "profile, which Python's sample gives; the plan then predicts the step).")                                     \
  X(cutting, std::shared_ptr<const ModelProfile>, profile, nullptr, kAny,                                          \
    "Balance \"time\": the measured costs of the model's layers (profile_model), at the micro-batch size the "     \
    "pipeline will run.")                                                                                          \
  X(cutting, std::vector<AtomicGroup>, atomic_groups, {}, kAny,                                                    \
    "Balance \"time\": runs of layers [first, last] that stay in one stage.")                                      \
  X(cutting, std::vector<int64_t>, memory_budgets, {}, kAny,                                                       \
    "Balance \"time\": bytes each stage's device may hold (weights, gradients, optimizer state, stashed "          \
    "micro-batches); one entry for every stage, or one per stage; empty: no limit.")                               \
  X(cutting, double, optimizer_state_per_weight, 0, at_least(0),                                                   \
    "Bytes of optimizer state per byte of trainable weights, for the memory prediction: 0 for plain SGD, 1 "       \
    "with momentum, 2 for Adam.")                                                                                  \
  X(cutting, std::vector<std::vector<std::string>>, tied_parameters, {}, kAny,                                     \
    "Tied weights: groups of parameter names (\"0.weight\", as named_parameters gives them) that are one "         \
    "logical parameter held by several layers, such as a language model's input embedding and output "             \
    "projection. Every copy starts from the earliest layer's value and, after each step's backwards, gets the "    \
    "sum of all their gradients, so the copies stay identical across devices and processes. A tensor "            \
    "registered in layers of several stages is such a group by itself. Synchronous schedules only.")

// --- the schedule ---------------------------------------------------------------------------------------------
#define CONVEYOR_SCHEDULING_OPTIONS(X)                                                                             \
  X(scheduling, int, workers, 0, at_least(0),                                                                      \
    "Workers: the threads (or processes) running the stages, one device each. 0: the number the cuts give "        \
    "(stages / chunks), else the number of devices when several are given, else 1.")                              \
  X(scheduling, int, chunks, 0, at_least(0),                                                                       \
    "Stages per worker (virtual stages): the model is cut into workers * chunks stages, stage s on worker "        \
    "s % workers (the V schedules: stages w and 2 * workers - 1 - w on worker w). 0: the schedule's own, 2 for "   \
    "\"interleaved\", \"zb-interleaved\" and the V schedules, 1 for the others.")                                 \
  X(scheduling, std::string, schedule, "1f1b", kAny,                                                               \
    "The schedule: a synchronous one (the exact gradients of the whole batch) or an asynchronous one (every "      \
    "micro-batch a mini-batch with its own update on every stage), by a name conveyor.schedule_names() lists.")   \
  X(scheduling, std::string, schedule_text, "", kAny,                                                              \
    "A schedule in text form (a line of actions per worker), or torch.distributed.pipelining's CSV; overrides "    \
    "schedule when not empty. Its counts must match the other options'.")                                          \
  X(scheduling, int, lookahead, 0, at_least(0),                                                                    \
    "\"eager-1f1b\" only: the forwards each stage runs ahead of 1F1B's warm-up per later stage, to hide a slow "   \
    "link's latency for as many more stashed micro-batches. 0: the schedule's default, 1.")                        \
  X(scheduling, bool, recompute, false, kAny,                                                                      \
    "Activation recomputation: each stage keeps only its inputs between a forward and its backward, which "        \
    "replays the forward first (synchronous schedules; exact gradients).")                                         \
  X(scheduling, bool, offload, false, kAny,                                                                        \
    "Recomputation whose kept inputs wait in pinned host memory, copied out after the forward and back ahead of "  \
    "the backward on a side stream (recomputation alone on a CPU stage).")                                         \
  X(scheduling, bool, vertical_sync, false, kAny,                                                                  \
    "\"pipedream\" only: every stage's forward of a micro-batch uses the weight version stage 0's forward used.")  \
  X(scheduling, std::vector<std::string>, devices, {}, kAny,                                                       \
    "Each worker's device (\"cpu\", \"cuda\", \"cuda:1\"): one entry for all, or one per worker; several "         \
    "workers may share one. Empty: cpu.")

// --- batching -------------------------------------------------------------------------------------------------
#define CONVEYOR_BATCHING_OPTIONS(X)                                                                               \
  X(batching, int, microbatches, 1, at_least(1),                                                                   \
    "Micro-batches each batch is split into along batch_dim: N samples give micro-batches of N / M, the first "    \
    "N % M of them one larger; N < M is an error.")                                                                \
  X(batching, int64_t, batch_dim, 0, at_least(0), "The dimension of inputs and targets that batches split along.") \
  X(batching, std::vector<int64_t>, shared_inputs, {}, kAny,                                                       \
    "Indices of inputs passed whole to every micro-batch instead of split (a [T, T] causal mask).")                \
  X(batching, std::vector<int64_t>, shared_targets, {}, kAny,                                                      \
    "Indices of targets passed whole to every micro-batch (class weights).")                                       \
  X(batching, LossReduction, loss_reduction, LossReduction::kMean, kAny,                                           \
    "What the loss function returns over its micro-batch: \"mean\" (weighted by its share of the batch, so that "  \
    "the step's loss and gradients equal the unsplit batch's) or \"sum\" (added as is).")

// --- training -------------------------------------------------------------------------------------------------
#define CONVEYOR_TRAINING_OPTIONS(X)                                                                               \
  X(training, OptimizerSpec, optimizer, {}, kAny,                                                                  \
    "The pipeline's own optimizer, one per stage over that stage's weights: \"sgd\", \"adam\" or \"adamw\" "      \
    "(torch.optim's, with lr, momentum and weight_decay), or in C++ a factory. Asynchronous schedules need it; a "  \
    "synchronous train_step then also steps it and clears the gradients. Without it the caller steps an "          \
    "optimizer over parameters().")                                                                                \
  X(training, std::optional<double>, lr, std::nullopt, kAny, "The learning rate of an optimizer given by name.")  \
  X(training, std::optional<double>, momentum, std::nullopt, kAny, "Momentum (\"sgd\" only).")                     \
  X(training, std::optional<double>, weight_decay, std::nullopt, kAny,                                             \
    "Weight decay of an optimizer given by name (torch.optim's default: 0, and 0.01 for \"adamw\").")             \
  X(training, LearningRateSchedule, lr_schedule, nullptr, kAny,                                                    \
    "lr_schedule(update) -> the learning rate of the pipeline's optimizer before each of its steps.")              \
  X(training, std::optional<UpdateUnit>, lr_schedule_unit, std::nullopt, kAny,                                     \
    "What lr_schedule's update counts: \"batch\" (synchronous schedules update once per batch) or "                \
    "\"microbatch\" (asynchronous ones, after each micro-batch). None: the schedule's own; the other is an error.") \
  X(training, std::optional<c10::ScalarType>, autocast, std::nullopt, kAny,                                        \
    "Mixed precision: every stage's forward and the loss run under autocast to bfloat16 or float16, as "           \
    "torch.autocast would run the unsplit model; weights, gradients and optimizer state keep their dtype. An "     \
    "activation crosses a boundary in the dtype its stage produced.")                                              \
  X(training, std::optional<LossScaling>, loss_scaling, std::nullopt, kAny,                                        \
    "Dynamic loss scaling, as torch.amp.GradScaler (float16 needs it): True, or init_scale, growth_factor, "       \
    "backoff_factor, growth_interval. One verdict per update across stages, processes and replicas: an inf or "    \
    "NaN gradient skips the update and backs the scale off. Needs the pipeline's own optimizer.")                  \
  X(training, double, clip_grad_norm, 0, finite(at_least(0)),                                                      \
    "Clip the gradients' global norm to this before the pipeline's optimizer steps (0: no clipping), as "          \
    "clip_grad_norm_ on the unsplit model; asynchronous schedules clip each stage's update by its own norm.")      \
  X(training, double, clip_norm_type, 2.0, kPositive,                                                              \
    "The norm clipping uses: 2 (Euclidean), any p > 0, or inf (the largest |g|).")                                 \
  X(training, double, clip_grad_value, 0, at_least(0),                                                             \
    "Clip every gradient element to [-v, v] before the pipeline's optimizer steps (0: no clipping), as "           \
    "clip_grad_value_ on the unsplit model; after loss scaling's unscaling and before clip_grad_norm.")            \
  X(training, int, accumulate_steps, 1, at_least(1),                                                               \
    "Gradient accumulation for the pipeline's optimizer (synchronous schedules): every n-th train_step steps, "    \
    "each step's loss weighted 1/n; a failed step drops the window.")                                              \
  X(training, bool, divergence_guard, true, kAny,                                                                  \
    "Stop with a DivergenceError at a non-finite loss or gradient, keeping the weights and optimizer state of "    \
    "the last good step (one host synchronisation per stage per step). With loss scaling, non-finite gradients "   \
    "are the scaler's verdict instead.")

// Whether the divergence guard checks each step: asked for, and not replaced
// by loss scaling's own verdict on non-finite gradients (the runtime guards,
// the planner prices the checks).
inline bool divergence_guarded(bool divergence_guard, bool loss_scaling) { return divergence_guard && !loss_scaling; }

// --- how steps run --------------------------------------------------------------------------------------------
#define CONVEYOR_RUNNING_OPTIONS(X)                                                                                \
  X(running, int, channel_capacity, 2, at_least(0),                                                                \
    "Messages a stage-to-stage channel buffers before a send blocks; schedules are validated against it "          \
    "(\"eager-1f1b\" raises it to its lookahead + 1).")                                                            \
  X(running, std::chrono::milliseconds, timeout, std::chrono::minutes(5), kPositive,                               \
    "Upper bound on every blocking wait (a receive, a send into a full channel), in seconds from Python; "         \
    "passing it fails the step with an error naming the stage and what it waited for.")                            \
  X(running, bool, trace, true, kAny, "Record each action's start and end in the step result (timelines).")        \
  X(running, bool, free_sent_activations, true, kAny,                                                              \
    "Once a stage has sent its outputs to another process or device, release their data and keep their graph, "   \
    "all the backward needs (not under zero-bubble schedules).")                                                   \
  X(running, bool, stage_rng, false, kAny,                                                                         \
    "Each stage draws random numbers from its own streams, seeded from the global seed and its index, so runs "    \
    "with dropout in several stages repeat bit for bit and checkpoints restore them.")

// --- the plan ---------------------------------------------------------------------------------------------------
// Whether the plan is the options' (given), searched on the profile of a
// sample batch (auto), or searched and then raced on it (tuned).
enum class PlanMode { kGiven, kAuto, kTuned };
constexpr std::array<const char*, 3> value_names(PlanMode) { return {"given", "auto", "tuned"}; }

#define CONVEYOR_PLANNING_OPTIONS(X)                                                                               \
  X(planning, PlanMode, plan, PlanMode::kGiven, kAny,                                                              \
    "\"given\": the plan the options describe. \"auto\": search the whole plan (workers, schedule, chunks, "       \
    "micro-batches, recomputation, split) on the profile of sample for the fastest predicted step within "         \
    "max_workers and memory_budget. \"tuned\": then race the twelve predicted fastest on sample, the slower "      \
    "half dropped each round.")                                                                                    \
  X(planning, int, max_workers, 0, at_least(0), "Plan \"auto\": the most workers to consider (0: workers, else 4).") \
  X(planning, int64_t, memory_budget, 0, at_least(0),                                                              \
    "Plan \"auto\": bytes each worker may hold (0: no limit).")

// --- what the front end does to the model -----------------------------------------------------------------------
#define CONVEYOR_MODEL_OPTIONS(X)                                                                                  \
  X(model, bool, fused_ops, false, kAny,                                                                           \
    "Swap Conveyor's fused LSTM into the model (a TorchScript module or torch::nn layers) before cutting it.")     \
  X(model, bool, optimize, false, kAny, "Let the TorchScript executor optimize the stages.")

// --- how a pipeline runs across processes ----------------------------------------------------------------------
#define CONVEYOR_DISTRIBUTED_OPTIONS(X)                                                                            \
  X(distributed, bool, scale_learning_rate, false, kAny,                                                           \
    "Multiply the pipeline's own optimizer's learning rate (lr_schedule included) by the number of replicas: the " \
    "linear scaling rule for a global batch that many times the per-replica one.")                                 \
  X(distributed, std::vector<std::vector<int64_t>>, activation_shapes, {}, kAny,                                   \
    "What stage k sends to stage k + 1, checked on arrival: entry k is the activation's shape, -1 for a "          \
    "dimension that may vary. Empty: not checked.")                                                                \
  X(distributed, int, local_rank, 0, at_least(0),                                                                  \
    "This process's index on its machine (torchrun's LOCAL_RANK, which Python reads): a device \"cuda\" becomes "  \
    "cuda:<local_rank>, so each process drives its own GPU.")                                                      \
  X(distributed, ShardLevel, shard, ShardLevel::kNone, kAny,                                                       \
    "What each stage's D replicas shard. \"optimizer\" (ZeRO stage 1; needs the pipeline's own optimizer and a "    \
    "synchronous schedule): each replica keeps the optimizer state of 1/D of the stage's weights, the gradients "  \
    "are reduce-scattered, each replica updates its part and the weights are all-gathered, to the same weights. " \
    "\"gradients\" (ZeRO stage 2) also keeps only each replica's 1/D of the reduced gradients, the whole ones "     \
    "released as they are reduced (after each backward where the schedule places a REDUCE_GRAD there). "          \
    "\"parameters\" (ZeRO stage 3) also keeps only each replica's 1/D of the weights: they are gathered at each "  \
    "stage's UNSHARD (before its first forward of a step) and their storage released at its RESHARD (after its "  \
    "last backward); outside a step they hold no storage (DistributedRunner::unshard gathers them).")             \
  X(distributed, bool, shared_memory, true, kAny,                                                                  \
    "Neighbouring workers on one machine pass activations and gradients through shared memory rather than "        \
    "Gloo's sockets (less processor time a message, the same failures); workers on other machines keep Gloo.")

// --- what only Python gives: conveyor.Pipeline's keywords that hold Python objects ------------------------------
// A row is P(name, Python annotation, documentation); the package reads them
// itself (python/conveyor/_options.py). An empty documentation: the C++ row
// of the same name says what it is.
#define CONVEYOR_PYTHON_KEYWORDS(P)                                                                                \
  P(loss_fn, "Union[Callable, str, torch.jit.ScriptModule, None]",                                                 \
    "loss_fn(output, target) -> scalar tensor, any Python callable (called on the last stage's thread "            \
    "with the GIL held for the call; output and target are tensors, or tuples of them for several), or "           \
    "\"cross_entropy\" / \"mse\", or a scripted module; loss_reduction says whether it returns a mean (the "       \
    "default) or a sum over its micro-batch.")                                                                     \
  P(lr_schedule, "Optional[Callable[[int], float]]",                                                               \
    "")                                                                                                            \
  P(sample, "Optional[Tuple[Tensors, Tensors]]",                                                                   \
    "An (inputs, target) batch of the size each step trains on, profiled for balance=\"time\" and "                \
    "plan=\"auto\".")                                                                                              \
  P(front_end, "Optional[str]",                                                                                    \
    "How an nn.Module becomes a graph the pipeline cuts: \"export\" (torch.export, the batch dimension "           \
    "dynamic, in training mode; the default), \"script\" (torch.jit.script; the default where fused_ops or "       \
    "optimize asks for TorchScript) or \"trace\" (torch.jit.trace of one run on example_inputs). Other "           \
    "models run as given.")                                                                                        \
  P(example_inputs, "Optional[Tensors]",                                                                           \
    "Inputs to export or trace the model with, when it is built; without them (or sample) an nn.Module is"         \
    " exported at the first train_step or forward, from its inputs.")                                              \
  P(output, "Union[str, int, Callable, None]",                                                                     \
    "For a forward that returns a dict, a dataclass (Hugging Face's ModelOutput) or a tuple: the output "          \
    "the pipeline returns and the loss reads, by key or attribute (\"logits\"), by index, or as "                  \
    "output(result) -> tensors. With front_end \"export\" or \"trace\".")                                          \
  P(model_kwargs, "Optional[Dict[str, Any]]",                                                                      \
    "Keyword arguments every forward call takes (use_cache=False, return_dict=True), with the inputs "             \
    "positionally. With front_end \"export\" or \"trace\".")                                                       \
  P(process_group, "Optional[ProcessGroup]",                                                                       \
    "Run across processes (under torchrun, after torch.distributed.init_process_group): the group of this"         \
    " replica's processes, each running one worker's stages (its rank in the group is the worker; workers"         \
    " is its size). Every process builds the pipeline from the same model and options and calls "                  \
    "train_step with its replica's batch; parameters() and state_dict() are then its own stages', "                \
    "StepResult.loss the whole batch's on every process.")                                                         \
  P(replica_group, "Optional[ProcessGroup]",                                                                       \
    "With process_group, data parallelism across replicas of the pipeline: the processes running this "            \
    "worker in every replica. Gradients are averaged across it; replica 0's initial weights are "                  \
    "broadcast. conveyor.process_groups(workers) makes both groups.")

#define CONVEYOR_OPTION_FIELD(section, Type, name, default_, bound, doc) Type name = default_;

// Each section's values, as the code that uses them takes them.
struct CuttingOptions {
  CONVEYOR_CUTTING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct SchedulingOptions {
  CONVEYOR_SCHEDULING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct BatchingOptions {
  CONVEYOR_BATCHING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct TrainingOptions {
  CONVEYOR_TRAINING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct RunningOptions {
  CONVEYOR_RUNNING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct PlanningOptions {
  CONVEYOR_PLANNING_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct ModelOptions {
  CONVEYOR_MODEL_OPTIONS(CONVEYOR_OPTION_FIELD)
};
struct DistributedOptions {
  CONVEYOR_DISTRIBUTED_OPTIONS(CONVEYOR_OPTION_FIELD)
};

// Every option, section by section, in the order the manual lists them.
#define CONVEYOR_PIPELINE_OPTIONS(X)                                                                               \
  CONVEYOR_CUTTING_OPTIONS(X)                                                                                      \
  CONVEYOR_SCHEDULING_OPTIONS(X)                                                                                   \
  CONVEYOR_BATCHING_OPTIONS(X)                                                                                     \
  CONVEYOR_TRAINING_OPTIONS(X)                                                                                     \
  CONVEYOR_RUNNING_OPTIONS(X)                                                                                      \
  CONVEYOR_PLANNING_OPTIONS(X)                                                                                     \
  CONVEYOR_MODEL_OPTIONS(X)                                                                                        \
  CONVEYOR_DISTRIBUTED_OPTIONS(X)

}  // namespace conveyor
