# The fused LSTM op, its module and its swapper; included by
# ops/sources.cmake.
target_sources(conveyor PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_driver.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_autograd.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_module.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_aten.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_dispatch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fused_lstm_swap.cpp)
if(CONVEYOR_WITH_CUDA)
  target_sources(conveyor PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/lstm_step_kernels.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/lstm_persistent_kernel.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/fused_lstm_cuda.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/fused_lstm_cuda_registration.cpp)
endif()
