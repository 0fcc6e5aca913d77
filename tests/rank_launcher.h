#pragma once
// Starts copies of the running test binary as the ranks of a job, on
// loopback, with the variables torchrun would set (RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and CONVEYOR_TEST_ROLE / _OUT, and
// collects each rank's exit status, exit time and output.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace conveyor::testing {

struct RankExit {
  int code = -1;       // exit status, or 128 + signal
  double seconds = 0;  // since the launch
  std::string log;     // stdout and stderr
};

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A rank still running this long after the launch is hung, not slow: the
// ranks' own waits give up within a minute (their timeouts, 30 s to connect),
// and a loaded machine under AddressSanitizer runs the longest role in about
// a minute and a half.
constexpr std::chrono::seconds kHungRank(300);

// Starts `world` copies of this binary as ranks of role `role`; kills any
// still running after kHungRank.
inline std::vector<RankExit> launch(const std::string& role, int world, const std::string& out,
                                    const std::map<std::string, std::string>& extra = {}) {
  std::filesystem::create_directories(out);
  const int port = free_port();
  std::vector<pid_t> pids;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> vars = extra;
    vars["CONVEYOR_TEST_ROLE"] = role;
    vars["CONVEYOR_TEST_OUT"] = out;
    vars["RANK"] = std::to_string(r);
    vars["LOCAL_RANK"] = std::to_string(r);
    vars["WORLD_SIZE"] = std::to_string(world);
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(port);
    std::vector<std::string> strings;
    for (char** e = environ; *e; ++e) {
      const std::string entry(*e);
      if (!vars.count(entry.substr(0, entry.find('=')))) strings.push_back(entry);
    }
    for (const auto& [k, v] : vars) strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    const std::string log = out + "/rank" + std::to_string(r) + ".log";
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<RankExit> exits(world);
  int running = world;
  while (running > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] == 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        exits[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        exits[r].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        pids[r] = 0;
        --running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() - start > kHungRank) {
      for (pid_t pid : pids) {
        if (pid != 0) ::kill(pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < world; ++r) {
    std::ifstream in(out + "/rank" + std::to_string(r) + ".log");
    exits[r].log.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return exits;
}

}  // namespace conveyor::testing
