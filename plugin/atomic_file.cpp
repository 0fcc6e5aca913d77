#include "plugin/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace conveyor {

namespace {

std::string system_error(const std::string& what) { return what + " (" + std::strerror(errno) + ")"; }

}  // namespace

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  // Unique per process, so ranks that share a directory do not collide.
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  try {
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      if (!out) throw std::runtime_error(system_error("cannot create " + temporary));
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
