#include "plugin/model/microbatches.h"

#include "plugin/core/errors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace conveyor {

int64_t split_microbatches(const Tensors& batch, const char* what, const std::vector<int64_t>& shared, int64_t dim,
                           int num_microbatches, std::vector<Tensors>& out) {
  const bool several = batch.size() > 1;
  const auto name = [&](size_t i) { return several ? c10::str(what, " ", i) : std::string(what); };
  // What makes tensor i go whole to every micro-batch, as the options name it.
  const auto share = [&](size_t i) {
    return c10::str("pass it whole to every micro-batch with shared_", what, "s({", i, "}) (the Python option ",
                    "\"shared_", what, "s\": [", i, "])");
  };
  for (int64_t i : shared) {
    check_argument(i >= 0 && i < static_cast<int64_t>(batch.size()), "conveyor: shared ", what, " ", i,
                   " is not one of the ", batch.size(), " given");
  }
  if (batch.empty()) throw std::invalid_argument(std::string("conveyor: no ") + what + " given");
  out.assign(num_microbatches, Tensors(batch.size()));
  int64_t n = -1;
  size_t n_from = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const at::Tensor& t = batch[i];
    const bool is_shared = std::find(shared.begin(), shared.end(), static_cast<int64_t>(i)) != shared.end();
    if (!t.defined() || is_shared) {
      for (auto& mb : out) mb[i] = t;
      continue;
    }
    if (t.dim() <= dim) {
      // A lone tensor shared would leave nothing to split.
      const std::string fix = several ? "; if every sample needs it whole (a [T, T] attention mask), " + share(i) : "";
      throw std::invalid_argument(
          c10::str("conveyor: the ", name(i), " has shape ", t.sizes(), ", which has no batch dimension ", dim, fix));
    }
    if (n >= 0 && t.size(dim) != n) {
      throw std::invalid_argument(c10::str("conveyor: the ", name(i), " has ", t.size(dim), " samples along dimension ",
                                           dim, " (shape ", t.sizes(), "), but the ", name(n_from), " has ", n,
                                           "; every split tensor needs the same batch size. If the ", name(i),
                                           " holds no samples but is the same for all (a [T, T] attention mask), ",
                                           share(i)));
    }
    n = t.size(dim);
    n_from = i;
    check_argument(n >= num_microbatches, "conveyor: a batch of ", n, " samples cannot be split into ",
                   num_microbatches, " micro-batches: each needs at least one sample (use a batch of at least ",
                   num_microbatches, " or fewer micro-batches)");
    const auto parts = t.tensor_split(num_microbatches, dim);
    for (int m = 0; m < num_microbatches; ++m) out[m][i] = parts[m];
  }
  if (n < 0) {
    throw std::invalid_argument(std::string("conveyor: every ") + what + " is shared or undefined, so nothing " +
                                "says how the batch splits into micro-batches");
  }
  return n;
}

Tensors join_microbatches(const std::vector<Tensors>& outputs, int64_t dim) {
  if (outputs.empty()) return {};
  Tensors joined(outputs[0].size());
  for (size_t i = 0; i < joined.size(); ++i) {
    std::vector<at::Tensor> parts;
    for (const auto& mb : outputs) {
      TORCH_CHECK(mb.size() == joined.size(), "conveyor: the last stage returned ", mb.size(), " tensors for one ",
                  "micro-batch and ", joined.size(), " for another");
      if (mb[i].defined()) parts.push_back(mb[i]);
    }
    if (parts.size() == 1) {
      joined[i] = parts[0];
    } else if (!parts.empty()) {
      joined[i] = at::cat(parts, dim);
    }
  }
  return joined;
}

}  // namespace conveyor
