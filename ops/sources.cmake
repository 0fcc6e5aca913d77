# The op library: layer adapters, count_nonfinite, the fused-op swap table,
# and each fused op of CONVEYOR_FUSED_OPS (a folder of ops/ that adds its own
# sources, CUDA ones only when CONVEYOR_WITH_CUDA). Included by the top-level
# CMakeLists after add_library(conveyor ...). Nothing here includes plugin/.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/nonfinite/nonfinite_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/swap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensors_layers.cpp)
include(${CMAKE_CURRENT_LIST_DIR}/dispatch/sources.cmake)
if(CONVEYOR_WITH_CUDA)
  target_sources(conveyor PRIVATE ${CMAKE_CURRENT_LIST_DIR}/nonfinite/nonfinite_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/shared_memory.cpp)
endif()
set(CONVEYOR_FUSED_OPS "fused_lstm;fused_attention" CACHE STRING "The fused ops (folders of ops/) built into the plugin")
foreach(op IN LISTS CONVEYOR_FUSED_OPS)
  if(NOT EXISTS ${CMAKE_CURRENT_LIST_DIR}/${op}/sources.cmake)
    message(FATAL_ERROR "CONVEYOR_FUSED_OPS names '${op}', but ops/${op}/sources.cmake does not exist")
  endif()
  include(${CMAKE_CURRENT_LIST_DIR}/${op}/sources.cmake)
endforeach()
