# Multi-process pipelines over c10d (Gloo on CPU, NCCL on CUDA when LibTorch
# has it): the transport, the process groups, hybrid and data parallelism.
target_sources(conveyor PRIVATE
  ${PROJECT_SOURCE_DIR}/plugin/transport_c10d.cpp
  ${PROJECT_SOURCE_DIR}/plugin/process_groups.cpp
  ${PROJECT_SOURCE_DIR}/plugin/gloo_group.cpp
  ${PROJECT_SOURCE_DIR}/plugin/distributed.cpp)

# ProcessGroupGloo.hpp includes Gloo's headers, which LibTorch's pip wheels do
# not ship: gloo_group.cpp, the one file that includes it, is compiled against
# declarations of the few names it uses, or against real Gloo headers when
# CONVEYOR_GLOO_INCLUDE_DIR names them. Its inline functions stay hidden so
# that none can interpose libtorch_cpu's.
set(CONVEYOR_GLOO_INCLUDE_DIR "" CACHE PATH "Gloo headers matching LibTorch's (empty: use plugin/gloo_declarations)")
if(CONVEYOR_GLOO_INCLUDE_DIR)
  set(_conveyor_gloo_include ${CONVEYOR_GLOO_INCLUDE_DIR})
else()
  set(_conveyor_gloo_include ${PROJECT_SOURCE_DIR}/plugin/gloo_declarations)
endif()
set_source_files_properties(${PROJECT_SOURCE_DIR}/plugin/gloo_group.cpp PROPERTIES
  INCLUDE_DIRECTORIES "${_conveyor_gloo_include}"
  COMPILE_OPTIONS "-fvisibility=hidden;-fvisibility-inlines-hidden")
