#include "ops/fused_lstm/fused_lstm_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

namespace conveyor::lstm {
namespace {

std::string weight_name(const char* kind, int64_t layer) { return std::string(kind) + "_l" + std::to_string(layer); }

void check_same_dtype_and_device(const at::Tensor& t, const std::string& name, const at::Tensor& input,
                                 const char* op) {
  TORCH_CHECK(t.scalar_type() == input.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
              " but input has dtype ", input.scalar_type(), "; all tensors must share one dtype");
  TORCH_CHECK(t.device() == input.device(), op, ": ", name, " is on ", t.device(), " but input is on ", input.device(),
              "; all tensors must be on one device");
}

void check_shape(const at::Tensor& t, c10::IntArrayRef expected, const std::string& name, const char* what,
                 const char* op) {
  TORCH_CHECK(t.sizes() == expected, op, ": ", name, " must have shape ", what, " = ", expected, ", got ", t.sizes());
}

}  // namespace

at::ScalarType accumulation_dtype(at::ScalarType dtype) { return dtype == at::kDouble ? at::kDouble : at::kFloat; }

LstmArgs check_lstm_args(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                         bool has_biases, const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is undefined");
  TORCH_CHECK(input.dim() == 3, op, ": input must be 3-D [seq_len, batch, input_size], got a ", input.dim(),
              "-D tensor of shape ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": input must be floating point, got ", input.scalar_type());
  const int64_t per_layer = has_biases ? 4 : 2;
  TORCH_CHECK(!weights.empty() && static_cast<int64_t>(weights.size()) % per_layer == 0, op,
              ": with has_biases=", has_biases ? "true" : "false", " weights must hold ", per_layer,
              " tensors per layer (weight_ih, weight_hh", has_biases ? ", bias_ih, bias_hh" : "", "), got ",
              weights.size());

  LstmArgs args;
  args.has_biases = has_biases;
  args.num_layers = static_cast<int64_t>(weights.size()) / per_layer;
  args.seq_len = input.size(0);
  args.batch = input.size(1);
  args.input_size = input.size(2);
  TORCH_CHECK(args.seq_len > 0, op, ": input has seq_len (dim 0) = 0; need at least one time step");
  TORCH_CHECK(args.batch > 0, op, ": input has batch (dim 1) = 0");

  const at::Tensor& w_hh0 = weights[1];
  TORCH_CHECK(w_hh0.dim() == 2, op, ": weight_hh_l0 must be 2-D [4*hidden_size, hidden_size], got shape ",
              w_hh0.sizes());
  args.hidden_size = w_hh0.size(1);
  const int64_t H = args.hidden_size;
  TORCH_CHECK(H > 0, op, ": hidden_size (weight_hh_l0 dim 1) must be positive");

  for (int64_t l = 0; l < args.num_layers; ++l) {
    LayerWeights lw;
    lw.w_ih = weights[l * per_layer];
    lw.w_hh = weights[l * per_layer + 1];
    const int64_t in = l == 0 ? args.input_size : H;
    const std::string ih = weight_name("weight_ih", l);
    const std::string hh = weight_name("weight_hh", l);
    TORCH_CHECK(lw.w_ih.dim() == 2, op, ": ", ih, " must be 2-D, got shape ", lw.w_ih.sizes());
    if (l == 0) {
      TORCH_CHECK(lw.w_ih.size(1) == in, op, ": input feature size (input dim 2) is ", in, " but ", ih, " expects ",
                  lw.w_ih.size(1), " (its dim 1)");
    }
    check_shape(lw.w_ih, {4 * H, in}, ih, "[4*hidden_size, in_features]", op);
    check_shape(lw.w_hh, {4 * H, H}, hh, "[4*hidden_size, hidden_size]", op);
    check_same_dtype_and_device(lw.w_ih, ih, input, op);
    check_same_dtype_and_device(lw.w_hh, hh, input, op);
    lw.w_ih = lw.w_ih.contiguous();
    lw.w_hh = lw.w_hh.contiguous();
    if (has_biases) {
      lw.b_ih = weights[l * per_layer + 2];
      lw.b_hh = weights[l * per_layer + 3];
      const std::string bih = weight_name("bias_ih", l);
      const std::string bhh = weight_name("bias_hh", l);
      check_shape(lw.b_ih, {4 * H}, bih, "[4*hidden_size]", op);
      check_shape(lw.b_hh, {4 * H}, bhh, "[4*hidden_size]", op);
      check_same_dtype_and_device(lw.b_ih, bih, input, op);
      check_same_dtype_and_device(lw.b_hh, bhh, input, op);
    }
    args.layers.push_back(std::move(lw));
  }

  const std::vector<int64_t> state_shape{args.num_layers, args.batch, H};
  TORCH_CHECK(h0.defined() && c0.defined(), op, ": h0 and c0 must both be given (zeros for a fresh state)");
  check_shape(h0, state_shape, "h0", "[num_layers, batch, hidden_size]", op);
  check_shape(c0, state_shape, "c0", "[num_layers, batch, hidden_size]", op);
  check_same_dtype_and_device(h0, "h0", input, op);
  check_same_dtype_and_device(c0, "c0", input, op);

  args.input = input.contiguous();
  args.h0 = h0.contiguous();
  args.c0 = c0.contiguous();
  return args;
}

void check_backward_args(const LstmArgs& args, const std::optional<at::Tensor>& grad_output,
                         const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                         const at::Tensor& output, const LstmWorkspace& workspace) {
  const char* op = "fused_lstm_backward";
  const int64_t T = args.seq_len, B = args.batch, H = args.hidden_size, L = args.num_layers;
  check_shape(output, {T, B, H}, "output", "[seq_len, batch, hidden_size]", op);
  if (grad_output && grad_output->defined()) {
    check_shape(*grad_output, {T, B, H}, "grad_output", "[seq_len, batch, hidden_size]", op);
  }
  if (grad_h_n && grad_h_n->defined()) {
    check_shape(*grad_h_n, {L, B, H}, "grad_h_n", "[num_layers, batch, hidden_size]", op);
  }
  if (grad_c_n && grad_c_n->defined()) {
    check_shape(*grad_c_n, {L, B, H}, "grad_c_n", "[num_layers, batch, hidden_size]", op);
  }
  check_shape(workspace.gates, {L, T, B, 4 * H}, "gates", "[num_layers, seq_len, batch, 4*hidden_size]", op);
  check_shape(workspace.cells, {L, T, B, H}, "cells", "[num_layers, seq_len, batch, hidden_size]", op);
  check_shape(workspace.hiddens, {L - 1, T, B, H}, "hiddens", "[num_layers-1, seq_len, batch, hidden_size]", op);
}

}  // namespace conveyor::lstm
