// bench_distributed: samples/s of one MLP trained by a 2-process pipeline, by
// 2-process all-reduce data parallelism, and by a single process, on the CPU.
// Every setup is the distributed_train example; its ranks are started here as
// torchrun would start them (loopback, one intra-op thread per process unless
// the setup says otherwise). Prints a markdown table for benchmarks/results/distributed.md.
//
//   bench_distributed [--exe PATH] [--repeats N] [-- extra distributed_train flags]
//
// Each setup runs --repeats times; the table shows the median.

#include "plugin/support/timing.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

struct Setup {
  std::string name;
  int processes;
  std::vector<std::string> flags;
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs the ranks; returns rank 0's "samples/s: X", or a negative number when a
// rank fails (its output is printed).
double run(const std::string& exe, const Setup& setup, const std::vector<std::string>& common) {
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < setup.processes; ++r) {
    std::vector<std::string> args{exe};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), setup.flags.begin(), setup.flags.end());
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    if (setup.processes > 1) {
      for (const auto& [k, v] : std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                                                   {"LOCAL_RANK", std::to_string(r)},
                                                                   {"WORLD_SIZE", std::to_string(setup.processes)},
                                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                                   {"MASTER_PORT", std::to_string(port)}}) {
        env.push_back(k + "=" + v);
      }
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    char log_template[] = "/tmp/bench_distributed_XXXXXX";
    const int fd = ::mkstemp(log_template);
    logs.emplace_back(log_template);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(fd);
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  double samples_per_second = -1;
  for (size_t r = 0; r < logs.size(); ++r) {
    std::ifstream in(logs[r]);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!ok) std::cerr << "--- " << setup.name << ", rank " << r << ":\n" << text;
    const auto at = text.rfind("samples/s: ");
    if (ok && r == 0 && at != std::string::npos) samples_per_second = std::stod(text.substr(at + 11));
    std::remove(logs[r].c_str());
  }
  return samples_per_second;
}

std::string machine() {
  utsname u{};
  ::uname(&u);
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ostringstream os;
  os << cpu << ", " << std::thread::hardware_concurrency() << " logical CPUs, " << u.sysname << " " << u.release;
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string exe = CONVEYOR_DISTRIBUTED_TRAIN;
  int repeats = 3;
  std::vector<std::string> common{"--steps=20",   "--batch=256",         "--hidden=512",       "--layers=6",
                                  "--inputs=256", "--log-every=1000000", "--timeout-ms=120000"};
  std::ostringstream command;
  command << argv[0];
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    command << " " << a;
    if (a == "--exe" && i + 1 < argc) {
      exe = argv[++i];
      command << " " << exe;
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::stoi(argv[++i]));
      command << " " << repeats;
    } else if (a == "--") {
      for (++i; i < argc; ++i) {
        common.emplace_back(argv[i]);
        command << " " << argv[i];
      }
    } else {
      std::cerr << "usage: bench_distributed [--exe PATH] [--repeats N] [-- distributed_train flags]\n";
      return 2;
    }
  }

  const std::vector<Setup> setups = {
      {"single process, 1 thread (LibTorch DataParallel, 1 CPU device)", 1, {"--parallel=dataparallel", "--threads=1"}},
      {"single process, 2 threads (LibTorch DataParallel, 1 CPU device)",
       1,
       {"--parallel=dataparallel", "--threads=2"}},
      {"pipeline, 2 stages, gpipe, M=4", 2, {"--parallel=pipeline", "--schedule=gpipe", "--microbatches=4"}},
      {"pipeline, 2 stages, 1f1b, M=4", 2, {"--parallel=pipeline", "--schedule=1f1b", "--microbatches=4"}},
      {"pipeline, 2 stages, 1f1b, M=8", 2, {"--parallel=pipeline", "--schedule=1f1b", "--microbatches=8"}},
      {"data parallel (c10d all-reduce), 2 processes", 2, {"--parallel=ddp"}},
  };
  std::vector<double> medians;
  for (const auto& setup : setups) {
    std::vector<double> runs;
    for (int i = 0; i < repeats; ++i) {
      const double s = run(exe, setup, common);
      if (s < 0) {
        std::cerr << "bench_distributed: '" << setup.name << "' failed\n";
        return 1;
      }
      runs.push_back(s);
    }
    medians.push_back(conveyor::median(runs));
    std::cerr << setup.name << ": " << medians.back() << " samples/s\n";
  }

  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M", std::localtime(&now));
  std::cout << "Command: `" << command.str() << "`  \nMachine: " << machine() << "  \nDate: " << date
            << "  \nWork: distributed_train";
  for (const auto& f : common) std::cout << " " << f;
  std::cout << " (float32 MLP, SGD; samples/s over steps 2..N, median of " << repeats << " runs)\n\n";
  std::cout << "| setup | processes | samples/s | vs 1 process, 1 thread |\n|---|---:|---:|---:|\n";
  for (size_t i = 0; i < setups.size(); ++i) {
    std::cout << "| " << setups[i].name << " | " << setups[i].processes << " | " << std::fixed << std::setprecision(0)
              << medians[i] << " | " << std::setprecision(2) << medians[i] / medians[0] << "x |\n";
  }
  return 0;
}
