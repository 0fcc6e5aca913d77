#include "ops/fused_lstm/fused_lstm_module.h"

#include "ops/fused_lstm/fused_lstm.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cmath>

namespace conveyor {

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_layers(const at::Tensor& input, const at::Tensor& h0,
                                                                 const at::Tensor& c0, at::TensorList weights,
                                                                 bool has_biases, int64_t num_layers, double dropout,
                                                                 bool train) {
  if (!train || dropout <= 0 || num_layers <= 1) return fused_lstm(input, h0, c0, weights, has_biases);
  // Dropout acts between layers, so run the layers one op call at a time.
  const int64_t per_layer = has_biases ? 4 : 2;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == num_layers * per_layer, "fused_lstm: ", num_layers,
              " layers need ", num_layers * per_layer, " weights, got ", weights.size());
  std::vector<at::Tensor> hs, cs;
  at::Tensor layer_input = input;
  for (int64_t l = 0; l < num_layers; ++l) {
    auto [out, h, c] = fused_lstm(layer_input, h0.narrow(0, l, 1), c0.narrow(0, l, 1),
                                  weights.slice(l * per_layer, per_layer), has_biases);
    hs.push_back(h);
    cs.push_back(c);
    layer_input = l + 1 < num_layers ? at::dropout(out, dropout, /*train=*/true) : out;
  }
  return {layer_input, at::cat(hs, 0), at::cat(cs, 0)};
}

void check_fused_lstm_options(const torch::nn::LSTMOptions& options) {
  TORCH_CHECK(!options.bidirectional(),
              "FusedLSTM: bidirectional=true is not supported (the fused kernels run one direction); "
              "keep torch::nn::LSTM for this layer");
  TORCH_CHECK(options.proj_size() == 0, "FusedLSTM: proj_size=", options.proj_size(),
              " is not supported (only proj_size=0); keep torch::nn::LSTM for this layer");
  TORCH_CHECK(options.input_size() > 0, "FusedLSTM: input_size must be positive, got ", options.input_size());
  TORCH_CHECK(options.hidden_size() > 0, "FusedLSTM: hidden_size must be positive, got ", options.hidden_size());
  TORCH_CHECK(options.num_layers() > 0, "FusedLSTM: num_layers must be positive, got ", options.num_layers());
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() <= 1, "FusedLSTM: dropout must be in [0, 1], got ",
              options.dropout());
}

FusedLSTMImpl::FusedLSTMImpl(const torch::nn::LSTMOptions& options_) : options(options_) { reset(); }

FusedLSTMImpl::FusedLSTMImpl(const torch::nn::LSTMOptions& options_, const torch::nn::Module& share_parameters_from)
    : options(options_) {
  check_fused_lstm_options(options);
  register_parameters(&share_parameters_from);
}

void FusedLSTMImpl::reset() {
  check_fused_lstm_options(options);
  register_parameters(nullptr);
  reset_parameters();
}

void FusedLSTMImpl::register_parameters(const torch::nn::Module* source) {
  const int64_t H = options.hidden_size();
  flat_weight_names_.clear();
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < options.num_layers(); ++l) {
    const int64_t in = l == 0 ? options.input_size() : H;
    const std::string suffix = "_l" + std::to_string(l);
    flat_weight_names_.push_back("weight_ih" + suffix);
    shapes.push_back({4 * H, in});
    flat_weight_names_.push_back("weight_hh" + suffix);
    shapes.push_back({4 * H, H});
    if (options.bias()) {
      flat_weight_names_.push_back("bias_ih" + suffix);
      shapes.push_back({4 * H});
      flat_weight_names_.push_back("bias_hh" + suffix);
      shapes.push_back({4 * H});
    }
  }
  if (source == nullptr) {
    for (size_t k = 0; k < shapes.size(); ++k) register_parameter(flat_weight_names_[k], torch::empty(shapes[k]));
    return;
  }
  const auto theirs = source->named_parameters(/*recurse=*/false);
  TORCH_CHECK(theirs.size() == flat_weight_names_.size(), "FusedLSTM: ", source->name(), " has ", theirs.size(),
              " parameters, expected ", flat_weight_names_.size(), " for these options");
  for (size_t k = 0; k < shapes.size(); ++k) {
    const at::Tensor* t = theirs.find(flat_weight_names_[k]);
    TORCH_CHECK(t != nullptr, "FusedLSTM: ", source->name(), " has no parameter ", flat_weight_names_[k]);
    TORCH_CHECK(t->sizes() == at::IntArrayRef(shapes[k]), "FusedLSTM: ", flat_weight_names_[k], " of ", source->name(),
                " has shape ", t->sizes(), ", expected ", at::IntArrayRef(shapes[k]));
    register_parameter(flat_weight_names_[k], *t, t->requires_grad());
  }
}

void FusedLSTMImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  const double stdv = 1.0 / std::sqrt(static_cast<double>(options.hidden_size()));
  for (auto& p : parameters()) p.uniform_(-stdv, stdv);
}

std::vector<at::Tensor> FusedLSTMImpl::flat_weights() const {
  std::vector<at::Tensor> weights;
  weights.reserve(flat_weight_names_.size());
  for (const auto& name : flat_weight_names_) weights.push_back(parameters_[name]);
  return weights;
}

void FusedLSTMImpl::flatten_parameters() {
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> weights = flat_weights();
  // Detached tensors share the parameters' storage but not their identity:
  // re-pointing them (set_) leaves the parameters and autograd's version
  // counters alone until set_data below.
  std::vector<at::Tensor> views;
  for (const auto& w : weights) views.push_back(w.detach());
  at::Tensor buffer;
  if (weights.front().is_cuda()) {
    // cuDNN's layout; copies the values in and points `views` into the buffer.
    constexpr int64_t kCudnnLstmMode = 2;  // CUDNN_LSTM
    buffer = at::_cudnn_rnn_flatten_weight(views, options.bias() ? 4 : 2, options.input_size(), kCudnnLstmMode,
                                           options.hidden_size(), /*proj_size=*/0, options.num_layers(),
                                           options.batch_first(), /*bidirectional=*/false);
  } else {
    int64_t total = 0;
    for (const auto& w : weights) total += w.numel();
    buffer = at::empty({total}, weights.front().options());
    int64_t offset = 0;
    for (auto& v : views) {
      const int64_t n = v.numel();
      at::Tensor slice = buffer.narrow(0, offset, n).view(v.sizes());
      slice.copy_(v);
      v = slice;
      offset += n;
    }
  }
  for (const auto& v : views) {
    if (!v.is_alias_of(buffer)) return;  // the flattening declined (cuDNN unavailable): leave them as they are
  }
  flat_pointers_.clear();
  for (size_t i = 0; i < weights.size(); ++i) {
    at::Tensor(weights[i]).set_data(views[i]);
    flat_pointers_.push_back(weights[i].data_ptr());
  }
  flat_buffer_ = buffer;
}

bool FusedLSTMImpl::parameters_flat() const {
  if (!flat_buffer_.defined()) return false;
  const std::vector<at::Tensor> weights = flat_weights();
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i].data_ptr() != flat_pointers_[i] || !weights[i].is_alias_of(flat_buffer_)) return false;
  }
  return true;
}

std::tuple<at::Tensor, std::tuple<at::Tensor, at::Tensor>> FusedLSTMImpl::forward(
    const at::Tensor& input, std::optional<std::tuple<at::Tensor, at::Tensor>> hx_opt) {
  TORCH_CHECK(input.dim() == 2 || input.dim() == 3, "FusedLSTM: input must be 3-D ",
              options.batch_first() ? "[batch, seq_len, input_size]" : "[seq_len, batch, input_size]",
              " or 2-D unbatched [seq_len, input_size], got a ", input.dim(), "-D tensor of shape ", input.sizes());
  const bool batched = input.dim() == 3;
  // The op is time-major; unbatched input is [seq_len, input_size] whatever batch_first says.
  at::Tensor x = batched ? input : input.unsqueeze(1);
  if (batched && options.batch_first()) x = x.transpose(0, 1);
  const int64_t L = options.num_layers();
  const int64_t H = options.hidden_size();

  at::Tensor h0, c0;
  if (hx_opt.has_value()) {
    std::tie(h0, c0) = *hx_opt;
    const int64_t want = batched ? 3 : 2;
    TORCH_CHECK(h0.dim() == want && c0.dim() == want, "FusedLSTM: for ", batched ? "batched 3-D" : "unbatched 2-D",
                " input, h0 and c0 must be ", want, "-D [num_layers", batched ? ", batch" : "",
                ", hidden_size], got h0 ", h0.sizes(), " and c0 ", c0.sizes());
    if (!batched) {
      h0 = h0.unsqueeze(1);
      c0 = c0.unsqueeze(1);
    }
  } else {
    h0 = at::zeros({L, x.size(1), H}, x.options());
    c0 = at::zeros({L, x.size(1), H}, x.options());
  }

  const FusedPath path = lstm_path(x, h0, c0, flat_weights(), L).path;
  if (path == FusedPath::kReference && x.is_cuda() && !parameters_flat()) flatten_parameters();
  auto [output, h_n, c_n] =
      lstm_layers_on(path, x, h0, c0, flat_weights(), options.bias(), L, options.dropout(), is_training());

  if (batched && options.batch_first()) output = output.transpose(0, 1);
  if (!batched) {
    output = output.squeeze(1);
    h_n = h_n.squeeze(1);
    c_n = c_n.squeeze(1);
  }
  return {output, {h_n, c_n}};
}

void FusedLSTMImpl::pretty_print(std::ostream& stream) const {
  stream << std::boolalpha << "conveyor::FusedLSTM(input_size=" << options.input_size()
         << ", hidden_size=" << options.hidden_size() << ", num_layers=" << options.num_layers()
         << ", bias=" << options.bias() << ", batch_first=" << options.batch_first()
         << ", dropout=" << options.dropout() << ")";
}

}  // namespace conveyor
