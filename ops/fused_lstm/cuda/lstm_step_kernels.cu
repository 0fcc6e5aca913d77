// The launchers of the per-time-step kernels (lstm_step_kernels.cuh).
#include "ops/fused_lstm/cuda/lstm_step_kernels.cuh"

#include <c10/cuda/CUDAException.h>

namespace conveyor::lstm::cuda {

using step::kTileBatch;
using step::kTileUnits;
using step::lstm_backward_step_kernel;
using step::lstm_forward_step_kernel;
using step::step_grid;

template <typename scalar_t>
void launch_forward_step(const ForwardStep<scalar_t>& step, cudaStream_t stream) {
  lstm_forward_step_kernel<scalar_t>
      <<<step_grid(step.batch, step.hidden), dim3(kTileUnits, kTileBatch), 0, stream>>>(step);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t>
void launch_backward_step(const BackwardStep<scalar_t>& step, cudaStream_t stream) {
  lstm_backward_step_kernel<scalar_t>
      <<<step_grid(step.batch, step.hidden), dim3(kTileUnits, kTileBatch), 0, stream>>>(step);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define CONVEYOR_INSTANTIATE_LSTM_STEPS(T)                                   \
  template void launch_forward_step<T>(const ForwardStep<T>&, cudaStream_t); \
  template void launch_backward_step<T>(const BackwardStep<T>&, cudaStream_t);
CONVEYOR_INSTANTIATE_LSTM_STEPS(float)
CONVEYOR_INSTANTIATE_LSTM_STEPS(double)
CONVEYOR_INSTANTIATE_LSTM_STEPS(c10::Half)
CONVEYOR_INSTANTIATE_LSTM_STEPS(c10::BFloat16)
#undef CONVEYOR_INSTANTIATE_LSTM_STEPS

}  // namespace conveyor::lstm::cuda
