#include "ops/fused_lstm/fused_lstm_driver.h"

#include <ATen/ATen.h>

namespace conveyor::lstm {
namespace {

at::Tensor defined_or_undefined(const std::optional<at::Tensor>& t) { return t && t->defined() ? *t : at::Tensor(); }

}  // namespace

ForwardResult run_forward(const LstmArgs& args, Recurrence& recurrence, bool keep_workspace) {
  const int64_t T = args.seq_len, B = args.batch, H = args.hidden_size, L = args.num_layers;
  const auto dtype = args.input.scalar_type();
  const auto acc_options = args.input.options().dtype(accumulation_dtype(dtype));
  const auto options = args.input.options();

  ForwardResult result;
  result.output = at::empty({T, B, H}, options);
  result.h_n = at::empty({L, B, H}, options);
  result.c_n = at::empty({L, B, H}, options);
  if (keep_workspace) {
    result.workspace.gates = at::empty({L, T, B, 4 * H}, acc_options);
    result.workspace.cells = at::empty({L, T, B, H}, acc_options);
    result.workspace.hiddens = at::empty({L - 1, T, B, H}, options);
  }

  at::Tensor x = args.input;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = args.layers[l];
    LayerForward layer;
    // All time steps' input projections in one GEMM: [T*B, in] x [in, 4H].
    layer.xproj = at::matmul(x.reshape({T * B, x.size(2)}), w.w_ih.t()).view({T, B, 4 * H});
    if (args.has_biases) {
      layer.bias = w.b_ih.to(acc_options.dtype()) + w.b_hh.to(acc_options.dtype());
    }
    layer.w_hh = w.w_hh;
    layer.h0 = args.h0[l];
    layer.c0 = args.c0[l].to(acc_options.dtype()).contiguous();
    const bool last = l == L - 1;
    if (keep_workspace) {
      layer.hs = last ? result.output : result.workspace.hiddens[l];
      layer.cells = result.workspace.cells[l];
      layer.gates = result.workspace.gates[l];
    } else {
      layer.hs = last ? result.output : at::empty({T, B, H}, options);
      layer.cells = at::empty({T, B, H}, acc_options);
    }
    recurrence.forward(layer);
    result.h_n[l].copy_(layer.hs[T - 1]);
    result.c_n[l].copy_(layer.cells[T - 1]);
    x = layer.hs;
  }
  return result;
}

BackwardResult run_backward(const LstmArgs& args, const std::optional<at::Tensor>& grad_output,
                            const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                            const at::Tensor& output, const LstmWorkspace& workspace, Recurrence& recurrence) {
  const int64_t T = args.seq_len, B = args.batch, H = args.hidden_size, L = args.num_layers;
  const auto dtype = args.input.scalar_type();
  const auto acc = accumulation_dtype(dtype);
  const at::Tensor dh_n_all = defined_or_undefined(grad_h_n);
  const at::Tensor dc_n_all = defined_or_undefined(grad_c_n);

  BackwardResult result;
  result.grad_h0 = at::empty({L, B, H}, args.input.options());
  result.grad_c0 = at::empty({L, B, H}, args.input.options());
  const int64_t per_layer = args.has_biases ? 4 : 2;
  result.grad_weights.resize(static_cast<size_t>(L * per_layer));

  // Gradient of the current layer's output sequence; for the top layer it is
  // grad_output, below it is the gradient of the input of the layer above.
  at::Tensor dh_seq = defined_or_undefined(grad_output);
  if (dh_seq.defined()) dh_seq = dh_seq.to(dtype).contiguous();
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerWeights& w = args.layers[l];
    const at::Tensor x = l == 0 ? args.input : workspace.hiddens[l - 1];
    const at::Tensor hs = l == L - 1 ? output.contiguous() : workspace.hiddens[l];

    LayerBackward layer;
    layer.dh_seq = dh_seq;
    if (dh_n_all.defined()) layer.dh_n = dh_n_all[l].to(acc).contiguous();
    if (dc_n_all.defined()) layer.dc_n = dc_n_all[l].to(acc).contiguous();
    layer.gates = workspace.gates[l].contiguous();
    layer.cells = workspace.cells[l].contiguous();
    layer.c0 = args.c0[l].to(acc).contiguous();
    layer.w_hh = w.w_hh;
    layer.dgates = at::empty({T, B, 4 * H}, args.input.options().dtype(acc));
    layer.dc0 = at::empty({B, H}, args.input.options().dtype(acc));
    recurrence.backward(layer);

    result.grad_h0[l].copy_(at::mm(layer.dgates[0], w.w_hh.to(acc)));
    result.grad_c0[l].copy_(layer.dc0);

    // Weight gradients summed over time: one GEMM each over all T*B rows.
    const at::Tensor dg_acc = layer.dgates.view({T * B, 4 * H});
    const at::Tensor dg = dg_acc.to(dtype);
    const at::Tensor h_prev = at::cat({args.h0[l].unsqueeze(0), hs.narrow(0, 0, T - 1)}, 0);
    result.grad_weights[l * per_layer] = at::mm(dg.t(), x.reshape({T * B, x.size(2)}));
    result.grad_weights[l * per_layer + 1] = at::mm(dg.t(), h_prev.reshape({T * B, H}));
    if (args.has_biases) {
      const at::Tensor db = dg_acc.sum(0).to(dtype);
      result.grad_weights[l * per_layer + 2] = db;
      result.grad_weights[l * per_layer + 3] = db.clone();
    }
    dh_seq = at::mm(dg, w.w_ih).view({T, B, x.size(2)});
  }
  result.grad_input = dh_seq;
  return result;
}

}  // namespace conveyor::lstm
