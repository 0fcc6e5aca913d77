#pragma once
// A checkpoint's bytes: torch::pickle_save's zip format (what torch.save
// writes), plus one record, "conveyor_digest", that holds a 64-bit FNV-1a
// digest of the pickle ("data.pkl") and of every tensor record ("data/0",
// "data/1", ...) in that order. Zip's own CRCs are not checked by LibTorch's
// reader, so without it a flipped bit in a tensor would load as a valid
// checkpoint of other weights; with it, any change to one byte of the content
// is refused. Python's torch.load ignores the extra record.

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace conveyor {

// The file's bytes for `value`, digest included.
std::vector<char> checkpoint_bytes(const c10::IValue& value);

// The value in `bytes` (read from `path`, named in errors). Throws
// std::invalid_argument for bytes that are not a readable archive, or whose
// digest does not match their content. `has_digest` tells whether it had one
// (files of format version 1 and 2 have none).
c10::IValue read_checkpoint_bytes(const std::vector<char>& bytes, const std::string& path, bool& has_digest);

}  // namespace conveyor
