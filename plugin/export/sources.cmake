# The torch.export front end: .pt2 archives read with the ExportedProgram
# schema's C++ types (LibTorch's generated_serialization_types.h, which needs
# nlohmann-json), the graph run by an interpreter with autograd, cut into the
# pipeline's layers. Builds on the runner (runner/); nothing below includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/archive.cpp
  ${CMAKE_CURRENT_LIST_DIR}/export_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/exported.cpp
  ${CMAKE_CURRENT_LIST_DIR}/interpreter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/program_args.cpp
  ${CMAKE_CURRENT_LIST_DIR}/program_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/segments.cpp)
target_compile_definitions(conveyor PUBLIC CONVEYOR_WITH_EXPORT=1)
