#pragma once
// Micro-batches: a batch of tensors split along the batch dimension into M
// micro-batches (torch::tensor_split: the first N % M one sample larger), and
// the last stage's outputs of each joined back into the batch's.

#include "plugin/core/types.h"

#include <cstdint>
#include <vector>

namespace conveyor {

// Micro-batch i's share of each tensor in out[i]; returns the samples in the
// batch. A tensor listed in `shared` (an index into `batch`) or undefined
// goes whole to every micro-batch; the others must agree on their size along
// `dim`. `what` ("input", "target") names the tensors in the
// std::invalid_argument thrown for a batch that does not split.
int64_t split_microbatches(const Tensors& batch, const char* what, const std::vector<int64_t>& shared, int64_t dim,
                           int num_microbatches, std::vector<Tensors>& out);

// Each output slot's micro-batch parts concatenated along `dim` (a slot
// undefined in every micro-batch stays undefined).
Tensors join_microbatches(const std::vector<Tensors>& outputs, int64_t dim);

}  // namespace conveyor
