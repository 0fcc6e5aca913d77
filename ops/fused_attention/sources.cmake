# The fused attention op, its modules and its swapper; included by
# ops/sources.cmake.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_autograd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_module.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_dispatch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_attention_swap.cpp
  ${CMAKE_CURRENT_LIST_DIR}/encoder_layer.cpp)
if(CONVEYOR_WITH_CUDA)
  target_sources(conveyor PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/fused_attention_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cuda/flash_forward.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/flash_backward.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/simple_attention.cu)
endif()
