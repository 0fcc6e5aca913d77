# The plugin: the public entry point here (pipeline, options, step results,
# errors, shared types, the operators' registration), and one folder per
# concern, each listing its own sources. Included by the top-level CMakeLists
# after add_library(conveyor ...).
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/errors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_names.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/profile_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_result.cpp)
foreach(folder support model trace planner runtime transport checkpoint distributed)
  include(${CMAKE_CURRENT_LIST_DIR}/${folder}/sources.cmake)
endforeach()
# TorchScript models in the pipeline and the Python class.
option(CONVEYOR_TORCHSCRIPT "Pipelines of TorchScript models and the Python class" ON)
if(CONVEYOR_TORCHSCRIPT)
  include(${CMAKE_CURRENT_LIST_DIR}/script/sources.cmake)
endif()
