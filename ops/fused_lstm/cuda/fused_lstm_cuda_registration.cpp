#include "ops/fused_lstm/cuda/fused_lstm_cuda.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(conveyor, CUDA, m) {
  m.impl("fused_lstm", &conveyor::lstm::fused_lstm_cuda);
  m.impl("fused_lstm_with_workspace", &conveyor::lstm::fused_lstm_with_workspace_cuda);
  m.impl("fused_lstm_backward", &conveyor::lstm::fused_lstm_backward_cuda);
}
