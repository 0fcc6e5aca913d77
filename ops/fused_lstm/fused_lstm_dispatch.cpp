// lstm_layers: the one place where an LSTM call of FusedLSTM or of a swapped
// TorchScript aten::lstm picks the fused kernel or at::lstm (cuDNN on CUDA),
// per ops/dispatch/fused_dispatch.h.
#include "ops/dispatch/fused_dispatch.h"
#include "ops/fused_lstm/fused_lstm.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/version.h>

#include <stdexcept>

namespace conveyor {
namespace {

bool records_autograd(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights) {
  if (!at::GradMode::is_enabled()) return false;
  if (input.requires_grad() || h0.requires_grad() || c0.requires_grad()) return true;
  for (const auto& w : weights) {
    if (w.requires_grad()) return true;
  }
  return false;
}

}  // namespace

bool fused_lstm_kernel_available(const c10::Device& device, c10::ScalarType dtype) {
  static const bool cuda_kernel = has_cuda_kernel("conveyor::fused_lstm");
  return fused_kernel_can_run(cuda_kernel, device, dtype);
}

DispatchQuery lstm_query(const c10::Device& device, c10::ScalarType dtype, const LstmShape& shape) {
  DispatchQuery query{"lstm", device, dtype, {}, {"train"}};
  query.shape = {{"seq", static_cast<double>(shape.seq)},       {"batch", static_cast<double>(shape.batch)},
                 {"input", static_cast<double>(shape.input)},   {"hidden", static_cast<double>(shape.hidden)},
                 {"layers", static_cast<double>(shape.layers)}, {"train", shape.train ? 1.0 : 0.0}};
  return query;
}

namespace {

// A thread's last decision, kept while the call's shape and the dispatch
// settings (dispatch_generation) stay the same: a pipeline's micro-batches
// repeat one shape, and a table look-up costs several microseconds.
template <typename Choice>
struct LastChoice {
  bool valid = false;
  uint64_t generation = 0;
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  LstmShape shape;
  Choice choice{};

  const Choice* find(const c10::Device& d, c10::ScalarType t, const LstmShape& s, uint64_t g) const {
    const bool same = valid && generation == g && device == d && dtype == t && shape.seq == s.seq &&
                      shape.batch == s.batch && shape.input == s.input && shape.hidden == s.hidden &&
                      shape.layers == s.layers && shape.train == s.train;
    return same ? &choice : nullptr;
  }
  const Choice& keep(const c10::Device& d, c10::ScalarType t, const LstmShape& s, uint64_t g, Choice c) {
    valid = true, generation = g, device = d, dtype = t, shape = s, choice = std::move(c);
    return choice;
  }
};

}  // namespace

DispatchChoice lstm_path(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                         int64_t num_layers) {
  const LstmShape shape{input.size(0), input.size(1), input.size(2), h0.size(-1), num_layers,
                        records_autograd(input, h0, c0, weights)};
  thread_local LastChoice<DispatchChoice> last;
  const uint64_t generation = dispatch_generation();
  if (const DispatchChoice* kept = last.find(input.device(), input.scalar_type(), shape, generation)) return *kept;
  return last.keep(input.device(), input.scalar_type(), shape, generation,
                   choose_fused_path(lstm_query(input.device(), input.scalar_type(), shape),
                                     fused_lstm_kernel_available(input.device(), input.scalar_type())));
}

bool lstm_allows_tf32() {
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 10
  return at::globalContext().allowTF32CuDNN("rnn");
#else
  return at::globalContext().allowTF32CuDNN(at::Float32Op::RNN);
#endif
}

LstmKernel lstm_kernel_named(const std::string& name) {
  if (name == "persistent") return LstmKernel::kPersistent;
  if (name == "persistent_fma") return LstmKernel::kPersistentFma;
  if (name == "v1") return LstmKernel::kV1;
  if (name == "step") return LstmKernel::kStep;
  throw std::invalid_argument("fused_lstm: no kernel named '" + name + "'");
}

LstmKernel lstm_kernel(const c10::Device& device, c10::ScalarType dtype, const LstmShape& shape) {
  thread_local LastChoice<LstmKernel> last;
  const uint64_t generation = dispatch_generation();
  if (const LstmKernel* kept = last.find(device, dtype, shape, generation)) return *kept;
  return last.keep(device, dtype, shape, generation, lstm_kernel_named(fused_kernel(lstm_query(device, dtype, shape))));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers_on(FusedPath path, const at::Tensor& input,
                                                              const at::Tensor& h0, const at::Tensor& c0,
                                                              at::TensorList weights, bool has_biases,
                                                              int64_t num_layers, double dropout, bool train) {
  if (path == FusedPath::kFused) return fused_lstm_layers(input, h0, c0, weights, has_biases, num_layers, dropout, train);
  return at::lstm(input, {h0, c0}, weights, has_biases, num_layers, dropout, train, /*bidirectional=*/false,
                  /*batch_first=*/false);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_layers(const at::Tensor& input, const at::Tensor& h0,
                                                           const at::Tensor& c0, at::TensorList weights,
                                                           bool has_biases, int64_t num_layers, double dropout,
                                                           bool train) {
  return lstm_layers_on(lstm_path(input, h0, c0, weights, num_layers).path, input, h0, c0, weights, has_biases,
                        num_layers, dropout, train);
}

}  // namespace conveyor
