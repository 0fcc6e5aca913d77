# TorchScript models in the pipeline, the Python class and checkpoints;
# included by the top-level CMakeLists after add_library(conveyor ...).
include_guard(GLOBAL)
target_sources(conveyor PRIVATE
  ${PROJECT_SOURCE_DIR}/plugin/script_graph.cpp
  ${PROJECT_SOURCE_DIR}/plugin/script_layer.cpp
  ${PROJECT_SOURCE_DIR}/plugin/torchscript.cpp
  ${PROJECT_SOURCE_DIR}/plugin/python_class.cpp
  ${PROJECT_SOURCE_DIR}/plugin/optimizer_state.cpp
  ${PROJECT_SOURCE_DIR}/plugin/checkpoint.cpp)
