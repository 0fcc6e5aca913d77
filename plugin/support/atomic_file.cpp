#include "plugin/support/atomic_file.h"

#include "plugin/support/fault_injection.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <streambuf>
#include <stdexcept>

namespace conveyor {

namespace {

std::string system_error(const std::string& what) { return what + " (" + std::strerror(errno) + ")"; }

// Passes bytes on to `target` until `limit` of them have gone, then refuses
// the rest as a full disk does (FaultInjector::write_limit).
class LimitedBuffer : public std::streambuf {
 public:
  LimitedBuffer(std::streambuf* target, int64_t limit) : target_(target), limit_(limit) {}

 protected:
  std::streamsize xsputn(const char* bytes, std::streamsize n) override {
    const std::streamsize room = std::max<std::streamsize>(0, std::min<std::streamsize>(n, limit_ - written_));
    const std::streamsize put = room > 0 ? target_->sputn(bytes, room) : 0;
    written_ += put;
    if (put < n) errno = ENOSPC;
    return put;
  }
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char byte = traits_type::to_char_type(c);
    return xsputn(&byte, 1) == 1 ? c : traits_type::eof();
  }
  int sync() override { return target_->pubsync(); }

 private:
  std::streambuf* target_;
  int64_t limit_;
  int64_t written_ = 0;
};

}  // namespace

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  // Unique per process, so ranks that share a directory do not collide.
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
      if (!file) throw std::runtime_error(system_error("cannot create " + temporary));
      FaultInjector* faults = fault_injector();
      const int64_t limit = faults ? faults->write_limit(path) : -1;
      std::optional<LimitedBuffer> limited;
      std::ostream limited_out(nullptr);
      if (limit >= 0) limited_out.rdbuf(&limited.emplace(file.rdbuf(), limit));
      std::ostream& out = limit >= 0 ? limited_out : file;
      write(out);
      out.flush();
      if (!out) throw std::runtime_error(system_error("cannot write " + temporary));
    }
    const int fd = ::open(temporary.c_str(), O_RDONLY);
    if (fd < 0 || ::fsync(fd) != 0) {
      const std::string error = system_error("cannot flush " + temporary + " to disk");
      if (fd >= 0) ::close(fd);
      throw std::runtime_error(error);
    }
    ::close(fd);
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
      throw std::runtime_error(system_error("cannot rename " + temporary + " to " + path));
    }
  } catch (const std::exception& e) {
    std::remove(temporary.c_str());
    throw std::runtime_error("conveyor: saving " + path + " failed, nothing was written: " + e.what());
  } catch (...) {
    std::remove(temporary.c_str());
    throw;
  }
}

void write_atomically(const std::string& path, const std::vector<char>& bytes) {
  write_atomically(path,
                   [&](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

}  // namespace conveyor
