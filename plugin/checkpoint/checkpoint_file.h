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

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor {

// The file's bytes for `value`, digest included.
std::vector<char> checkpoint_bytes(const c10::IValue& value);

// The n-byte little-endian number at `bytes` (zip and pickle fields; the
// caller checked the bounds).
uint64_t little_endian(const char* bytes, int n);

// Whether every record of the zip archive `bytes` fits in it, by the sizes
// its central directory declares (found as miniz, LibTorch's zip reader, finds
// them, ZIP64 fields included): LibTorch's reader allocates a record's
// declared size before reading it, already while it opens the archive, so a
// damaged size must be caught before. Also false where the directory cannot
// be read at all.
bool zip_records_fit(const std::vector<char>& bytes);

// Checks the digest of the archive that `reader` reads (a file at `path`,
// named in errors): returns whether it has one (files of format version 1 and
// 2 have none); throws std::invalid_argument if its content does not match it
// or its records cannot be read. The caller has checked that no record
// outsizes the file.
bool check_digest(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path);

}  // namespace conveyor
