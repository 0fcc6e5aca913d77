# The foundation every folder of the plugin builds on: errors, shared types,
# every option's row (option_list.h) and what is made of the rows (the
# options a pipeline takes, their values as Python gives them), step
# results, and the schedules' operators for torch.ops.conveyor. Of the rest
# of the plugin it includes only support/ and version.h.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/errors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/option_values.cpp
  ${CMAKE_CURRENT_LIST_DIR}/options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_result.cpp)
