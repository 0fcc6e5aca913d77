# Multi-process training over c10d (Gloo on CPU, NCCL on CUDA when LibTorch
# has it): the process groups, the hybrid pipeline x data-parallel job and
# the data-parallel baselines. The transport itself is in transport/. Builds
# on the runner (runner/); nothing below includes it.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/process_groups.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collectives.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gloo_group.cpp
  ${CMAKE_CURRENT_LIST_DIR}/distributed_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharded_optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/data_parallel.cpp)

# ProcessGroupGloo.hpp includes Gloo's headers, which LibTorch's pip wheels do
# not ship: gloo_group.cpp, the one file that includes it, is compiled against
# declarations of the few names it uses, or against real Gloo headers when
# CONVEYOR_GLOO_INCLUDE_DIR names them. Its inline functions stay hidden so
# that none can interpose libtorch_cpu's.
set(CONVEYOR_GLOO_INCLUDE_DIR "" CACHE PATH "Gloo headers matching LibTorch's (empty: use plugin/distributed/gloo_declarations)")
if(CONVEYOR_GLOO_INCLUDE_DIR)
  set(_conveyor_gloo_include ${CONVEYOR_GLOO_INCLUDE_DIR})
else()
  set(_conveyor_gloo_include ${CMAKE_CURRENT_LIST_DIR}/gloo_declarations)
endif()
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gloo_group.cpp PROPERTIES
  INCLUDE_DIRECTORIES "${_conveyor_gloo_include}"
  COMPILE_OPTIONS "-fvisibility=hidden;-fvisibility-inlines-hidden")
