// conveyor::lstm: the fused LSTM behind aten::lstm's signature, so that a
// TorchScript graph's aten::lstm node can be pointed at it (see
// swap_fused_ops(torch::jit::Module&) in ops/swap.h):
//
//   lstm(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases,
//        int num_layers, float dropout, bool train, bool bidirectional,
//        bool batch_first) -> (Tensor, Tensor, Tensor)
//
// What fused_lstm cannot run (two directions, a projection, a device without
// a fused kernel) goes to at::lstm, so the node gives torch's result whatever
// the module's options turn out to be; the rest goes through lstm_layers,
// which runs whichever of the two the dispatch table finds faster.
#include "ops/fused_lstm/fused_lstm_aten.h"
#include "ops/fused_lstm/fused_lstm.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace conveyor {

std::optional<std::string> aten_lstm_unsupported(bool bidirectional, int64_t num_params, bool has_biases,
                                                 int64_t num_layers) {
  if (bidirectional) return "bidirectional LSTM: the fused op runs one direction only";
  if (num_params != num_layers * (has_biases ? 4 : 2)) return "LSTM with proj_size > 0: the fused op has no projection";
  return std::nullopt;
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> aten_lstm(const at::Tensor& input, at::TensorList hx,
                                                         at::TensorList params, bool has_biases, int64_t num_layers,
                                                         double dropout, bool train, bool bidirectional,
                                                         bool batch_first) {
  const bool fused =
      !aten_lstm_unsupported(bidirectional, static_cast<int64_t>(params.size()), has_biases, num_layers) &&
      input.dim() == 3 && hx.size() == 2;
  if (!fused) {
    return at::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  const at::Tensor x = batch_first ? input.transpose(0, 1) : input;
  auto [output, h_n, c_n] = lstm_layers(x, hx[0], hx[1], params, has_biases, num_layers, dropout, train);
  if (batch_first) output = output.transpose(0, 1);
  return {output, h_n, c_n};
}

}  // namespace
}  // namespace conveyor

TORCH_LIBRARY_FRAGMENT(conveyor, m) {
  m.def(
      "lstm(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers, float dropout,"
      " bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)");
}

// Composite: autograd comes from the ops it calls (fused_lstm's own backward).
TORCH_LIBRARY_IMPL(conveyor, CompositeImplicitAutograd, m) { m.impl("lstm", &conveyor::aten_lstm); }
