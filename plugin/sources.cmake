# The plugin's core (pipeline, runtime, stages, partition, options, errors,
# step results, workers, the operator library) and its rooms, each of which
# lists its own sources. Included by the top-level CMakeLists after
# add_library(conveyor ...).
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/action_timer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/activation_stash.cpp
  ${CMAKE_CURRENT_LIST_DIR}/atomic_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/balance_time.cpp
  ${CMAKE_CURRENT_LIST_DIR}/errors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_injection.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_names.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/png.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime_actions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime_split.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_random.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_result.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_rollback.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tied_parameters.cpp
  ${CMAKE_CURRENT_LIST_DIR}/timeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/weight_versions.cpp
  ${CMAKE_CURRENT_LIST_DIR}/workers.cpp)
include(${CMAKE_CURRENT_LIST_DIR}/transport/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/checkpoint/sources.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/distributed/sources.cmake)
# TorchScript models in the pipeline and the Python class.
option(CONVEYOR_TORCHSCRIPT "Pipelines of TorchScript models and the Python class" ON)
if(CONVEYOR_TORCHSCRIPT)
  include(${CMAKE_CURRENT_LIST_DIR}/script/sources.cmake)
endif()
