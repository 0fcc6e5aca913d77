#pragma once
// A checkpoint's bytes: torch::pickle_save's zip format (what torch.save
// writes), plus one record, "conveyor_digest", that holds a 64-bit FNV-1a
// digest of the pickle ("data.pkl") and of every tensor record ("data/0",
// "data/1", ...) in that order. Zip's own CRCs are not checked by LibTorch's
// reader, so without it a flipped bit in a tensor would load as a valid
// checkpoint of other weights; with it, any change to one byte of the content
// is refused. Python's torch.load ignores the extra record.

#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>

#include <string>
#include <vector>

namespace conveyor {

// The file's bytes for `value`, digest included.
std::vector<char> checkpoint_bytes(const c10::IValue& value);

// Checks the digest of the archive that `reader` reads (a file at `path`,
// named in errors): returns whether it has one (files of format version 1 and
// 2 have none); throws std::invalid_argument if its content does not match it
// or its records cannot be read. The caller has checked that no record
// outsizes the file.
bool check_digest(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path);

}  // namespace conveyor
