# The fused attention op; included by the top-level CMakeLists after
# add_library(conveyor ...).
target_sources(conveyor PRIVATE
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/attention_checks.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/attention_cpu.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/attention_op.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/fused_multihead_attention.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/encoder_layer.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/swap_attention.cpp
  ${PROJECT_SOURCE_DIR}/ops/fused_attention/swap_registration.cpp)
if(CONVEYOR_WITH_CUDA)
  target_sources(conveyor PRIVATE
    ${PROJECT_SOURCE_DIR}/ops/fused_attention/cuda/attention_cuda.cpp
    ${PROJECT_SOURCE_DIR}/ops/fused_attention/cuda/flash_forward.cu
    ${PROJECT_SOURCE_DIR}/ops/fused_attention/cuda/flash_backward.cu
    ${PROJECT_SOURCE_DIR}/ops/fused_attention/cuda/simple_attention.cu)
endif()
