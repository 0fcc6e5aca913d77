# The headers install() puts under include/conveyor/: <conveyor/conveyor.h>
# and what a user's code may name. The runtime's internals, the
# fault-injection hooks, the picture internals, the transports' wire state and
# the checkpoint loader's checks stay out. tests/check_layout.cmake checks
# that these include only each other (and ops/, schedules/); tests/consumer
# builds against them.
set(CONVEYOR_SCRIPT_HEADERS plugin/script/torchscript.h plugin/script/script_layer.h)
set(CONVEYOR_EXPORT_HEADERS plugin/export/exported.h plugin/export/export_layer.h plugin/export/program.h
  plugin/export/segments.h)
set(CONVEYOR_PUBLIC_HEADERS
  plugin/conveyor.h plugin/pipeline.h plugin/version.h
  plugin/core/errors.h plugin/core/option_list.h plugin/core/option_rows.h plugin/core/options.h
  plugin/core/step_result.h plugin/core/types.h
  plugin/runner/stage_runner.h plugin/measure/profile_model.h plugin/measure/race_candidates.h
  plugin/model/model_names.h plugin/model/stage.h plugin/model/stage_split.h plugin/model/stage_random.h
  plugin/model/tied_parameters.h plugin/model/sharded_state.h
  plugin/planner/balance_time.h plugin/planner/partition.h plugin/planner/planner.h plugin/planner/profile.h
  plugin/planner/search.h
  plugin/trace/timeline.h plugin/support/atomic_file.h plugin/support/tensors.h
  plugin/transport/transport.h plugin/transport/c10d.h
  plugin/checkpoint/checkpoint.h plugin/checkpoint/checkpoint_file.h plugin/checkpoint/optimizer_state.h
  plugin/checkpoint/model_state.h
  plugin/distributed/data_parallel.h plugin/distributed/distributed_runner.h plugin/measure/c10d_link.h
  plugin/distributed/process_groups.h plugin/distributed/sharded_optimizer.h
  plugin/builder/front_end.h plugin/builder/plan.h plugin/builder/request.h
  ${CONVEYOR_SCRIPT_HEADERS} ${CONVEYOR_EXPORT_HEADERS})
