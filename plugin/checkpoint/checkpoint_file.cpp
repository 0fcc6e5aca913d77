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
