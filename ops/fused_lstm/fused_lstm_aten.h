#pragma once
// conveyor::lstm, the fused LSTM with aten::lstm's signature (registered by
// fused_lstm_aten.cpp), and the rule for what it runs fused.

#include <cstdint>
#include <optional>
#include <string>

namespace conveyor {

// Why an aten::lstm call with these arguments cannot run fused (conveyor::lstm
// then calls at::lstm), or nullopt if it can. `num_params` is the length of
// its params list: 4 per layer with biases, 2 without, more with a projection.
std::optional<std::string> aten_lstm_unsupported(bool bidirectional, int64_t num_params, bool has_biases,
                                                 int64_t num_layers);

}  // namespace conveyor
