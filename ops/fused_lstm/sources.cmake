# The fused LSTM op, its module and its swapper: included by the top-level
# CMakeLists after add_library(conveyor ...).
target_sources(conveyor PRIVATE
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_checks.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_driver.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_ops.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_cpu.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_autograd.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_module.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_aten.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_lstm/fused_lstm_swap.cpp)
if(CONVEYOR_WITH_CUDA)
  target_sources(conveyor PRIVATE
    ${PROJECT_SOURCE_DIR}/ops/fused_lstm/cuda/lstm_step_kernels.cu
    ${PROJECT_SOURCE_DIR}/ops/fused_lstm/cuda/lstm_persistent_kernel.cu
    ${PROJECT_SOURCE_DIR}/ops/fused_lstm/cuda/fused_lstm_cuda.cu
    ${PROJECT_SOURCE_DIR}/ops/fused_lstm/cuda/fused_lstm_cuda_registration.cpp)
endif()
