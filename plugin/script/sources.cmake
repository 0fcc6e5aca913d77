# The TorchScript front end: TorchScript models cut into the pipeline's layers
# (graph cutting, script layers). Builds on the runner (runner/); only the
# builder (plugin/builder/) includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/forward_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/script_nodes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/torchscript.cpp)
target_compile_definitions(conveyor PUBLIC CONVEYOR_WITH_TORCHSCRIPT=1)
