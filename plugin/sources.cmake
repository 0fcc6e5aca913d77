# The plugin: the public entry point here (pipeline.h, the one class a user
# builds, and conveyor.h, which includes everything a user may name), and one
# folder per concern, each listing its own sources, from the foundation
# (core/) up. Included by the top-level CMakeLists after add_library(conveyor ...).
foreach(folder core support model trace planner runtime transport runner checkpoint distributed measure)
  include(${CMAKE_CURRENT_LIST_DIR}/${folder}/sources.cmake)
endforeach()
# TorchScript models in the pipeline and the Python class.
option(CONVEYOR_TORCHSCRIPT "Pipelines of TorchScript models and the Python class" ON)
if(CONVEYOR_TORCHSCRIPT)
  include(${CMAKE_CURRENT_LIST_DIR}/script/sources.cmake)
endif()
# torch.export programs (.pt2) in the pipeline: needs LibTorch's ExportedProgram
# schema header and nlohmann-json (Debian's nlohmann-json3-dev; set-up installs it).
option(CONVEYOR_EXPORT "Pipelines of torch.export programs (.pt2)" ON)
if(CONVEYOR_EXPORT)
  find_path(CONVEYOR_NLOHMANN_JSON_DIR nlohmann/json.hpp)
  find_path(CONVEYOR_EXPORT_SCHEMA_DIR torch/csrc/utils/generated_serialization_types.h HINTS ${TORCH_INCLUDE_DIRS}
    NO_DEFAULT_PATH)
  if(CONVEYOR_NLOHMANN_JSON_DIR AND CONVEYOR_EXPORT_SCHEMA_DIR)
    include(${CMAKE_CURRENT_LIST_DIR}/export/sources.cmake)
    target_include_directories(conveyor PRIVATE ${CONVEYOR_NLOHMANN_JSON_DIR})
  else()
    message(WARNING "conveyor: no nlohmann/json.hpp (${CONVEYOR_NLOHMANN_JSON_DIR}) or no ExportedProgram schema in "
      "LibTorch (${CONVEYOR_EXPORT_SCHEMA_DIR}): building without torch.export programs")
    set(CONVEYOR_EXPORT OFF)
  endif()
endif()
# The one way from a model to a pipeline, over all of the above.
include(${CMAKE_CURRENT_LIST_DIR}/builder/sources.cmake)
