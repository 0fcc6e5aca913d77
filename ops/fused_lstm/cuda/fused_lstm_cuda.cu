// The CUDA side of the fused LSTM: the per-layer time loops (the kernel the
// dispatch table names, persistent where it fits, else one fused kernel per
// step) behind the shared layer driver, and the op kernels.
#include "ops/fused_lstm/cuda/fused_lstm_cuda.h"

#include "ops/fused_lstm/cuda/lstm_kernels.h"
#include "ops/fused_lstm/fused_lstm_checks.h"
#include "ops/fused_lstm/fused_lstm.h"
#include "ops/fused_lstm/fused_lstm_driver.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <type_traits>

namespace conveyor::lstm {
namespace {

template <typename T>
T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// The persistent kernels' product for this dtype: tensor cores where the
// dtype (and, for float32, PyTorch's TF32 setting) allows, unless `fma`.
template <typename scalar_t>
cuda::Math product_math(bool fma) {
  if (fma) return cuda::Math::kFma;
  if constexpr (std::is_same_v<scalar_t, c10::Half> || std::is_same_v<scalar_t, c10::BFloat16>) {
    return cuda::Math::kMma16;
  } else if constexpr (std::is_same_v<scalar_t, float>) {
    return lstm_allows_tf32() ? cuda::Math::kTf32 : cuda::Math::kFma;
  }
  return cuda::Math::kFma;
}

class CudaRecurrence final : public Recurrence {
 public:
  explicit CudaRecurrence(const LstmArgs& args) : args_(args) {}

  void forward(LayerForward& layer) override {
    const LstmKernel kernel = kernel_for(layer.gates.defined());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, layer.xproj.scalar_type(), "fused_lstm_cuda_forward",
                                    [&] { forward_typed<scalar_t>(layer, kernel); });
  }

  void backward(LayerBackward& layer) override {
    const LstmKernel kernel = kernel_for(true);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, layer.w_hh.scalar_type(), "fused_lstm_cuda_backward",
                                    [&] { backward_typed<scalar_t>(layer, kernel); });
  }

 private:
  // The kernel the dispatch table (or an override) names for this call.
  LstmKernel kernel_for(bool train) const {
    const LstmShape shape{args_.seq_len, args_.batch, args_.input_size, args_.hidden_size, args_.num_layers, train};
    return lstm_kernel(args_.input.device(), args_.input.scalar_type(), shape);
  }

  template <typename scalar_t>
  static void forward_typed(LayerForward& layer, LstmKernel kernel) {
    using acc_t = cuda::AccOf<scalar_t>;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const at::Tensor xproj = layer.xproj.contiguous();
    const at::Tensor h0 = layer.h0.contiguous();
    const int T = static_cast<int>(xproj.size(0));
    const int B = static_cast<int>(xproj.size(1));
    const int H = static_cast<int>(layer.w_hh.size(1));
    TORCH_INTERNAL_ASSERT(layer.hs.is_contiguous() && layer.cells.is_contiguous());
    TORCH_INTERNAL_ASSERT(!layer.gates.defined() || layer.gates.is_contiguous());

    cuda::ForwardSequence<scalar_t> seq;
    seq.xproj = xproj.data_ptr<scalar_t>();
    seq.bias = data_or_null<acc_t>(layer.bias);
    seq.w_hh = layer.w_hh.data_ptr<scalar_t>();
    seq.h0 = h0.data_ptr<scalar_t>();
    seq.c0 = layer.c0.data_ptr<acc_t>();
    seq.hs = layer.hs.data_ptr<scalar_t>();
    seq.cells = layer.cells.data_ptr<acc_t>();
    seq.gates = data_or_null<acc_t>(layer.gates);
    seq.seq_len = T;
    seq.batch = B;
    seq.hidden = H;
    switch (kernel) {
      case LstmKernel::kPersistent:
      case LstmKernel::kPersistentFma:
        if (cuda::try_launch_forward_persistent(seq, product_math<scalar_t>(kernel == LstmKernel::kPersistentFma),
                                                stream)) {
          return;
        }
        break;
      case LstmKernel::kV1:
        if (cuda::try_launch_forward_persistent_warp(seq, stream)) return;
        break;
      case LstmKernel::kStep:
        break;
    }

    const int64_t BH = static_cast<int64_t>(B) * H;
    for (int t = 0; t < T; ++t) {
      cuda::ForwardStep<scalar_t> step;
      step.xproj_t = seq.xproj + t * 4 * BH;
      step.bias = seq.bias;
      step.w_hh = seq.w_hh;
      step.h_prev = t == 0 ? seq.h0 : seq.hs + (t - 1) * BH;
      step.c_prev = t == 0 ? seq.c0 : seq.cells + (t - 1) * BH;
      step.h_out = seq.hs + t * BH;
      step.c_out = seq.cells + t * BH;
      step.gates_out = seq.gates ? seq.gates + t * 4 * BH : nullptr;
      step.batch = B;
      step.hidden = H;
      cuda::launch_forward_step(step, stream);
    }
  }

  template <typename scalar_t>
  static void backward_typed(LayerBackward& layer, LstmKernel kernel) {
    using acc_t = cuda::AccOf<scalar_t>;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const int T = static_cast<int>(layer.gates.size(0));
    const int B = static_cast<int>(layer.gates.size(1));
    const int H = static_cast<int>(layer.w_hh.size(1));
    const int64_t BH = static_cast<int64_t>(B) * H;
    const at::Tensor dh_seq =
        layer.dh_seq.defined() ? layer.dh_seq.to(layer.w_hh.scalar_type()).contiguous() : at::Tensor();
    // dL/dc, carried backwards through time and updated in place by each step.
    const at::Tensor dc = layer.dc_n.defined() ? layer.dc_n.clone() : at::zeros_like(layer.c0);
    TORCH_INTERNAL_ASSERT(layer.dgates.is_contiguous());

    const acc_t* gates = layer.gates.data_ptr<acc_t>();
    const acc_t* cells = layer.cells.data_ptr<acc_t>();
    acc_t* dgates = layer.dgates.data_ptr<acc_t>();
    if (kernel == LstmKernel::kPersistent || kernel == LstmKernel::kPersistentFma) {
      cuda::BackwardSequence<scalar_t> seq;
      seq.w_hh = layer.w_hh.data_ptr<scalar_t>();
      seq.dh_seq = dh_seq.defined() ? dh_seq.data_ptr<scalar_t>() : nullptr;
      seq.dh_last = data_or_null<acc_t>(layer.dh_n);
      seq.gates = gates;
      seq.cells = cells;
      seq.c0 = layer.c0.data_ptr<acc_t>();
      seq.dc = dc.data_ptr<acc_t>();
      seq.dgates = dgates;
      seq.seq_len = T;
      seq.batch = B;
      seq.hidden = H;
      if (cuda::try_launch_backward_persistent(seq, product_math<scalar_t>(kernel == LstmKernel::kPersistentFma),
                                               stream)) {
        layer.dc0.copy_(dc);
        return;
      }
    }
    for (int t = T - 1; t >= 0; --t) {
      cuda::BackwardStep<scalar_t> step;
      step.dgates_next = t + 1 < T ? dgates + (t + 1) * 4 * BH : nullptr;
      step.w_hh = layer.w_hh.data_ptr<scalar_t>();
      step.dh_out_t = dh_seq.defined() ? dh_seq.data_ptr<scalar_t>() + t * BH : nullptr;
      step.dh_last = t == T - 1 ? data_or_null<acc_t>(layer.dh_n) : nullptr;
      step.gates_t = gates + t * 4 * BH;
      step.c_t = cells + t * BH;
      step.c_prev = t > 0 ? cells + (t - 1) * BH : layer.c0.data_ptr<acc_t>();
      step.dc = dc.data_ptr<acc_t>();
      step.dgates_t = dgates + t * 4 * BH;
      step.batch = B;
      step.hidden = H;
      cuda::launch_backward_step(step, stream);
    }
    layer.dc0.copy_(dc);
  }

  const LstmArgs& args_;
};

LstmArgs checked_cuda_args(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                           bool has_biases, const char* op) {
  LstmArgs args = check_lstm_args(input, h0, c0, weights, has_biases, op);
  TORCH_CHECK(args.batch * args.hidden_size * 4 <= std::numeric_limits<int>::max(), op,
              ": batch * 4 * hidden_size = ", args.batch * args.hidden_size * 4, " is too large for the CUDA kernels");
  return args;
}

}  // namespace

LstmOutputs fused_lstm_cuda(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                            bool has_biases) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const LstmArgs args = checked_cuda_args(input, h0, c0, weights, has_biases, "fused_lstm");
  CudaRecurrence recurrence(args);
  ForwardResult r = run_forward(args, recurrence, /*keep_workspace=*/false);
  return {r.output, r.h_n, r.c_n};
}

LstmOutputsWithWorkspace fused_lstm_with_workspace_cuda(const at::Tensor& input, const at::Tensor& h0,
                                                        const at::Tensor& c0, at::TensorList weights, bool has_biases) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const LstmArgs args = checked_cuda_args(input, h0, c0, weights, has_biases, "fused_lstm");
  CudaRecurrence recurrence(args);
  ForwardResult r = run_forward(args, recurrence, /*keep_workspace=*/true);
  return {r.output, r.h_n, r.c_n, r.workspace.gates, r.workspace.cells, r.workspace.hiddens};
}

LstmGradients fused_lstm_backward_cuda(const std::optional<at::Tensor>& grad_output,
                                       const std::optional<at::Tensor>& grad_h_n,
                                       const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                       const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                                       bool has_biases, const at::Tensor& output, const at::Tensor& gates,
                                       const at::Tensor& cells, const at::Tensor& hiddens) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const LstmArgs args = checked_cuda_args(input, h0, c0, weights, has_biases, "fused_lstm_backward");
  const LstmWorkspace workspace{gates.contiguous(), cells.contiguous(), hiddens.contiguous()};
  check_backward_args(args, grad_output, grad_h_n, grad_c_n, output, workspace);
  CudaRecurrence recurrence(args);
  BackwardResult r = run_backward(args, grad_output, grad_h_n, grad_c_n, output, workspace, recurrence);
  return {r.grad_input, r.grad_h0, r.grad_c0, r.grad_weights};
}

}  // namespace conveyor::lstm
