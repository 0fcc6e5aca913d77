#include "plugin/checkpoint/checkpoint_file.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>

namespace conveyor {

namespace {

constexpr const char* kDigestRecord = "conveyor_digest";

// FNV-1a: each byte is mixed in by a bijection of the state, so changing any
// one byte of the input always changes the digest.
class Digest {
 public:
  void add(const void* data, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) state_ = (state_ ^ bytes[i]) * 0x100000001b3ULL;
    // The length too, so that bytes moved from one record to the next count.
    for (int shift = 0; shift < 64; shift += 8) state_ = (state_ ^ ((n >> shift) & 0xff)) * 0x100000001b3ULL;
  }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(state_));
    return text;
  }

 private:
  uint64_t state_ = 0xcbf29ce484222325ULL;
};

}  // namespace

uint64_t little_endian(const char* bytes, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

bool zip_records_fit(const std::vector<char>& bytes) {
  const uint64_t size = bytes.size();
  const auto le = [&](uint64_t at, int n) { return little_endian(bytes.data() + at, n); };
  constexpr uint64_t kEnd = 22, kLocator = 20, kEnd64 = 56, kEntry = 46, kMax32 = 0xffffffffULL;
  if (size < kEnd) return false;
  // The end-of-directory record: the last signature with room for the record
  // after it, within the final 64 KiB (a comment's most) and 22 bytes.
  uint64_t end = size - kEnd + 1;
  const uint64_t lowest = size > 0xffff + kEnd ? size - 0xffff - kEnd : 0;
  do {
    if (end-- == lowest) return false;
  } while (le(end, 4) != 0x06054b50);
  uint64_t entries = le(end + 10, 2), dir_size = le(end + 12, 4), dir_at = le(end + 16, 4);
  if (end >= kLocator + kEnd64 && le(end - kLocator, 4) == 0x07064b50) {
    const uint64_t at64 = le(end - kLocator + 8, 8);
    if (at64 > size - kEnd64) return false;
    if (le(at64, 4) == 0x06064b50) {  // ZIP64: its numbers replace those of the 32-bit record
      entries = le(at64 + 32, 8);
      dir_size = le(at64 + 40, 8);
      dir_at = le(at64 + 48, 8);
    }
  }
  if (dir_at > size || dir_size > size - dir_at || entries > dir_size / kEntry) return false;
  uint64_t at = dir_at;
  const uint64_t dir_end = dir_at + dir_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (dir_end - at < kEntry || le(at, 4) != 0x02014b50) return false;
    uint64_t packed = le(at + 20, 4), unpacked = le(at + 24, 4), local = le(at + 42, 4);
    const uint64_t name = le(at + 28, 2), extra = le(at + 30, 2), comment = le(at + 32, 2);
    if (kEntry + name + extra + comment > dir_end - at) return false;
    // A size of 2^32 - 1 stands for the 64-bit one in the ZIP64 extra field
    // (id 1), which holds those that stand for one, in this order.
    uint64_t field = at + kEntry + name;
    const uint64_t fields_end = field + extra;
    while (fields_end - field >= 4) {
      const uint64_t id = le(field, 2), length = le(field + 2, 2);
      if (length > fields_end - field - 4) return false;
      if (id == 1) {
        uint64_t value = field + 4;
        for (uint64_t* v : {&unpacked, &packed, &local}) {
          if (*v != kMax32) continue;
          if (field + 4 + length - value < 8) return false;
          *v = le(value, 8);
          value += 8;
        }
        break;
      }
      field += 4 + length;
    }
    if (unpacked > size || packed > size) return false;
    at += kEntry + name + extra + comment;
  }
  return true;
}

std::vector<char> checkpoint_bytes(const c10::IValue& value) {
  // torch::pickle_save without the type tags it puts on every dict and list:
  // Python's torch.load, whose default weights_only mode refuses those tags,
  // then reads the file as plain dicts.
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* bytes, size_t n) { pickled.insert(pickled.end(), bytes, bytes + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  Digest digest;
  digest.add(pickled.data(), pickled.size());
  for (const at::Tensor& tensor : pickler.tensorData()) {
    const auto data = torch::jit::getWriteableTensorData(tensor);  // what the writer stores
    digest.add(data.data(), data.sizeInBytes());
  }
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + n);
    return n;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  const std::string hex = digest.hex();
  writer.writeRecord(kDigestRecord, hex.data(), hex.size());
  writer.writeEndOfFile();
  return archive;
}

bool check_digest(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path) {
  if (!reader.hasRecord(kDigestRecord)) return false;
  Digest digest;
  std::string stored;
  try {
    const auto add = [&](const std::string& name) {
      const auto [data, size] = reader.getRecord(name);
      digest.add(data.get(), size);
    };
    add("data.pkl");
    for (int i = 0; reader.hasRecord("data/" + std::to_string(i)); ++i) add("data/" + std::to_string(i));
    const auto [data, size] = reader.getRecord(kDigestRecord);
    stored.assign(static_cast<const char*>(data.get()), size);
  } catch (const std::exception&) {
    throw std::invalid_argument("conveyor: '" + path + "' is not a readable checkpoint (truncated or not one)");
  }
  if (stored != digest.hex()) {
    throw std::invalid_argument("conveyor: checkpoint '" + path + "' is damaged: its content does not match the " +
                                "digest it was saved with (changed or cut after it was written); nothing was loaded");
  }
  return true;
}

}  // namespace conveyor
