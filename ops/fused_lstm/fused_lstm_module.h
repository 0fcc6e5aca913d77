#pragma once
// conveyor::FusedLSTM: a drop-in for torch::nn::LSTM that runs conveyor::fused_lstm.
//
// Same options (torch::nn::LSTMOptions), the same parameter names and shapes
// (weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}) and the same
// initialisation, so state dicts move between the two either way; the same
// forward signature and result, (output, (h_n, c_n)). Supports batch_first,
// an optional initial (h0, c0), dropout between layers in training, and (like
// Python's torch.nn.LSTM, unlike libtorch's) unbatched 2-D input. Not supported, and rejected by the constructor:
// bidirectional and proj_size > 0.
//
//   conveyor::FusedLSTM lstm(torch::nn::LSTMOptions(128, 256).num_layers(2).batch_first(true));
//   auto [out, state] = lstm(x);

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/options/rnn.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

namespace conveyor {

class FusedLSTMImpl : public torch::nn::Cloneable<FusedLSTMImpl> {
 public:
  FusedLSTMImpl(int64_t input_size, int64_t hidden_size)
      : FusedLSTMImpl(torch::nn::LSTMOptions(input_size, hidden_size)) {}
  explicit FusedLSTMImpl(const torch::nn::LSTMOptions& options);
  // Takes the very parameter tensors of `share_parameters_from` (by name; e.g.
  // a torch::nn::LSTM with the same options) instead of new ones, so both
  // modules see every update. Draws no random numbers.
  FusedLSTMImpl(const torch::nn::LSTMOptions& options, const torch::nn::Module& share_parameters_from);

  void reset() override;

  // Uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), like torch::nn::LSTM.
  void reset_parameters();

  std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>> forward(
      const at::Tensor& input, std::optional<std::tuple<at::Tensor, at::Tensor>> hx_opt = {});

  // The parameters in torch::nn::LSTM's flat order.
  std::vector<at::Tensor> flat_weights() const;

  // Makes the parameters views into one buffer, as torch::nn::LSTM keeps them
  // on CUDA: there in cuDNN's layout, so that at::lstm hands the buffer to
  // cuDNN instead of compacting the weights into a new one on every call
  // (elsewhere in the flat order). The parameter objects stay the same
  // (set_data), so an optimizer made before keeps stepping them, and their
  // values do not change. forward() calls it on CUDA whenever the dispatched
  // path is at::lstm and the parameters are no longer flat: a device or dtype
  // move, a state-dict or checkpoint load, or a stashed weight version points
  // them elsewhere; optimizer steps (in place) keep them flat.
  void flatten_parameters();
  // Whether every parameter is still the view flatten_parameters made.
  bool parameters_flat() const;

  void pretty_print(std::ostream& stream) const override;

  torch::nn::LSTMOptions options;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(std::optional<std::tuple<at::Tensor, at::Tensor>>())})

 private:
  // Registers the parameters: new uninitialised tensors, or those of `source`.
  void register_parameters(const torch::nn::Module* source);

  std::vector<std::string> flat_weight_names_;
  at::Tensor flat_buffer_;                  // what the parameters view, once flattened
  std::vector<const void*> flat_pointers_;  // where each of them then started
};

TORCH_MODULE(FusedLSTM);

// Throws, naming the option, if FusedLSTM cannot implement these options.
void check_fused_lstm_options(const torch::nn::LSTMOptions& options);

}  // namespace conveyor
