# The TorchScript front end: TorchScript models cut into the pipeline's layers
# (graph cutting, script layers) and torch.classes.conveyor.Pipeline for
# Python. Builds on the public entry point; nothing below includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/script_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_nodes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/torchscript.cpp
  ${CMAKE_CURRENT_LIST_DIR}/build_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/python_class.cpp
  ${CMAKE_CURRENT_LIST_DIR}/python_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_pipeline.cpp)
