// The CPU kernels of the fused LSTM: a reference written with ATen ops, one
// time step at a time, in the order torch::nn::LSTM computes. bfloat16 and
// float16 are computed in float32 and the results rounded back.
#include "ops/fused_lstm/fused_lstm_checks.h"
#include "ops/fused_lstm/fused_lstm_driver.h"
#include "ops/fused_lstm/fused_lstm_ops.h"

#include <ATen/ATen.h>
#include <torch/library.h>

namespace conveyor::lstm {
namespace {

class CpuRecurrence final : public Recurrence {
 public:
  void forward(LayerForward& layer) override {
    const int64_t T = layer.xproj.size(0);
    const at::Tensor w_hh_t = layer.w_hh.t();
    at::Tensor h = layer.h0;
    at::Tensor c = layer.c0;
    for (int64_t t = 0; t < T; ++t) {
      at::Tensor pre = at::addmm(layer.xproj[t], h, w_hh_t);
      if (layer.bias.defined()) pre = pre + layer.bias;
      const auto chunks = pre.chunk(4, 1);
      const at::Tensor i = chunks[0].sigmoid();
      const at::Tensor f = chunks[1].sigmoid();
      const at::Tensor g = chunks[2].tanh();
      const at::Tensor o = chunks[3].sigmoid();
      c = f * c + i * g;
      h = o * c.tanh();
      layer.cells[t].copy_(c);
      layer.hs[t].copy_(h);
      if (layer.gates.defined()) layer.gates[t].copy_(at::cat({i, f, g, o}, 1));
    }
  }

  void backward(LayerBackward& layer) override {
    const int64_t T = layer.gates.size(0);
    const at::Tensor w_hh = layer.w_hh.to(layer.dgates.scalar_type());
    at::Tensor dh = layer.dh_n.defined() ? layer.dh_n : at::zeros_like(layer.c0);
    at::Tensor dc = layer.dc_n.defined() ? layer.dc_n : at::zeros_like(layer.c0);
    for (int64_t t = T - 1; t >= 0; --t) {
      if (layer.dh_seq.defined()) dh = dh + layer.dh_seq[t];
      const auto gates = layer.gates[t].chunk(4, 1);
      const at::Tensor& i = gates[0];
      const at::Tensor& f = gates[1];
      const at::Tensor& g = gates[2];
      const at::Tensor& o = gates[3];
      const at::Tensor c_prev = t > 0 ? layer.cells[t - 1] : layer.c0;
      const at::Tensor tanh_c = layer.cells[t].tanh();
      dc = dc + dh * o * (1 - tanh_c * tanh_c);
      const at::Tensor d_i = dc * g * i * (1 - i);
      const at::Tensor d_f = dc * c_prev * f * (1 - f);
      const at::Tensor d_g = dc * i * (1 - g * g);
      const at::Tensor d_o = dh * tanh_c * o * (1 - o);
      const at::Tensor dgates = at::cat({d_i, d_f, d_g, d_o}, 1);
      layer.dgates[t].copy_(dgates);
      dc = dc * f;
      if (t > 0) dh = at::mm(dgates, w_hh);
    }
    layer.dc0.copy_(dc);
  }
};

bool computed_in_float(const at::Tensor& input) {
  return input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
}

at::Tensor to_float(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }

std::optional<at::Tensor> to_float(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? std::optional<at::Tensor>(t->to(at::kFloat)) : t;
}

std::vector<at::Tensor> to_float(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(to_float(t));
  return out;
}

// The checks run on the caller's tensors, so their messages name the caller's dtypes.
ForwardResult forward_cpu(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                          bool has_biases, bool keep_workspace, const char* op) {
  LstmArgs args = check_lstm_args(input, h0, c0, weights, has_biases, op);
  CpuRecurrence recurrence;
  if (!computed_in_float(input)) return run_forward(args, recurrence, keep_workspace);
  const auto float_weights = to_float(weights);
  args = check_lstm_args(to_float(input), to_float(h0), to_float(c0), float_weights, has_biases, op);
  ForwardResult r = run_forward(args, recurrence, keep_workspace);
  r.output = r.output.to(input.scalar_type());
  r.h_n = r.h_n.to(input.scalar_type());
  r.c_n = r.c_n.to(input.scalar_type());
  return r;
}

LstmOutputs fused_lstm_cpu(const at::Tensor& input, const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                           bool has_biases) {
  ForwardResult r = forward_cpu(input, h0, c0, weights, has_biases, /*keep_workspace=*/false, "fused_lstm");
  return {r.output, r.h_n, r.c_n};
}

LstmOutputsWithWorkspace fused_lstm_with_workspace_cpu(const at::Tensor& input, const at::Tensor& h0,
                                                       const at::Tensor& c0, at::TensorList weights, bool has_biases) {
  ForwardResult r = forward_cpu(input, h0, c0, weights, has_biases, /*keep_workspace=*/true, "fused_lstm");
  return {r.output, r.h_n, r.c_n, r.workspace.gates, r.workspace.cells, r.workspace.hiddens};
}

LstmGradients fused_lstm_backward_cpu(const std::optional<at::Tensor>& grad_output,
                                      const std::optional<at::Tensor>& grad_h_n,
                                      const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input,
                                      const at::Tensor& h0, const at::Tensor& c0, at::TensorList weights,
                                      bool has_biases, const at::Tensor& output, const at::Tensor& gates,
                                      const at::Tensor& cells, const at::Tensor& hiddens) {
  const char* op = "fused_lstm_backward";
  const bool in_float = computed_in_float(input);
  const auto float_weights = in_float ? to_float(weights) : std::vector<at::Tensor>();
  const LstmArgs args =
      in_float ? check_lstm_args(to_float(input), to_float(h0), to_float(c0), float_weights, has_biases, op)
               : check_lstm_args(input, h0, c0, weights, has_biases, op);
  // In float the saved hidden sequences are float already (see forward_cpu).
  const LstmWorkspace workspace{gates, cells, in_float ? to_float(hiddens) : hiddens};
  const at::Tensor out = in_float ? to_float(output) : output;
  check_backward_args(args, grad_output, grad_h_n, grad_c_n, out, workspace);
  CpuRecurrence recurrence;
  BackwardResult r = in_float ? run_backward(args, to_float(grad_output), to_float(grad_h_n), to_float(grad_c_n), out,
                                             workspace, recurrence)
                              : run_backward(args, grad_output, grad_h_n, grad_c_n, out, workspace, recurrence);
  if (in_float) {
    const auto dtype = input.scalar_type();
    r.grad_input = r.grad_input.to(dtype);
    r.grad_h0 = r.grad_h0.to(dtype);
    r.grad_c0 = r.grad_c0.to(dtype);
    for (auto& g : r.grad_weights) g = g.to(dtype);
  }
  return {r.grad_input, r.grad_h0, r.grad_c0, r.grad_weights};
}

}  // namespace
}  // namespace conveyor::lstm

TORCH_LIBRARY_IMPL(conveyor, CPU, m) {
  m.impl("fused_lstm", &conveyor::lstm::fused_lstm_cpu);
  m.impl("fused_lstm_with_workspace", &conveyor::lstm::fused_lstm_with_workspace_cpu);
  m.impl("fused_lstm_backward", &conveyor::lstm::fused_lstm_backward_cpu);
}
