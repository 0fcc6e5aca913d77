#pragma once
// Runs CUDA kernels' C++ on the host, so that their indexing, fragment
// layouts, masking and synchronisation can be checked without a GPU (the
// attention kernels: ops/fused_attention/cuda/host_emulation; the LSTM's:
// ops/fused_lstm/cuda/host_emulation). Force-included (-include) before the
// kernel headers; compiled by the host compiler against the CUDA toolkit's
// headers (for __half, __nv_bfloat16).
//
// One std::thread per CUDA thread (kept between launches). launch() runs the blocks of a grid one
// after another, sharing one array as their shared memory, which starts as
// NaN bytes; launch_cooperative() runs them all at once, each with shared
// memory of its own, for kernels that synchronise the grid
// (cooperative_groups::this_grid().sync(): include/cooperative_groups.h).
// Warp-wide instructions (shuffles, ldmatrix, mma) meet at a per-warp barrier
// and compute what the PTX ISA specifies for every lane. cp.async copies land
// only when a cp.async.wait_group makes them due, so a missing wait reads
// stale NaNs instead of passing by luck. Between two barriers of a block,
// a cp.async into 16 bytes of its dynamic shared memory and an ldmatrix of
// them by another warp are a race, whichever came first, and abort the run
// naming both warps (a missing __syncthreads before a buffer is refilled,
// which the deferred copies alone would let pass). Not emulated: other
// memory-ordering races between warps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <semaphore>
#include <thread>
#include <vector>

namespace emulated {
struct Warp {
  explicit Warp(int lanes = 32) : bar(lanes) {}
  std::barrier<> bar;
  const void* addr[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
  double shfl[32];
};
// The block's barrier phases: each ends an epoch of the race check.
struct EpochTick {
  std::atomic<uint32_t>* epoch;
  void operator()() noexcept { epoch->fetch_add(1, std::memory_order_relaxed); }
};
struct Block {
  explicit Block(int threads, size_t smem_bytes = 0) : bar(threads, EpochTick{&epoch}), smem(smem_bytes, 0xff) {
    for (int i = 0; i < (threads + 31) / 32; ++i) warps.emplace_back(std::make_unique<Warp>(std::min(32, threads - 32 * i)));
    if (smem_bytes) watch_shared(smem.data(), smem_bytes);
  }
  // The dynamic shared memory the race check watches, 16 bytes a tag.
  void watch_shared(unsigned char* base, size_t bytes) {
    shared_base = base;
    written = std::vector<std::atomic<uint64_t>>((bytes + 15) / 16);
    read = std::vector<std::atomic<uint64_t>>((bytes + 15) / 16);
  }
  std::atomic<uint32_t> epoch{1};
  std::barrier<EpochTick> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<unsigned char> smem;  // launch_cooperative's: each block's own
  std::atomic<int> votes{0};        // __syncthreads_or/_and's count
  // Per 16 bytes: (epoch << 32) | (cp.async's warp + 1), and (epoch << 32) | the ldmatrix readers' warp bits.
  unsigned char* shared_base = nullptr;
  std::vector<std::atomic<uint64_t>> written, read;
};
struct Copy {
  void* dst;
  const void* src;
  bool valid;
  size_t bytes;
};
inline thread_local uint3 tl_thread_idx, tl_block_idx;
inline thread_local dim3 tl_block_dim, tl_grid_dim;
inline thread_local Block* tl_block = nullptr;
inline std::function<void()> grid_barrier;  // launch_cooperative's grid barrier: arrive and wait
inline thread_local std::vector<std::vector<Copy>> tl_committed;
inline thread_local std::vector<Copy> tl_open;
inline std::atomic<long> collective_count{0};

inline int linear_thread() { return static_cast<int>(tl_thread_idx.x + tl_block_dim.x * tl_thread_idx.y); }
inline Warp& my_warp() { return *tl_block->warps[linear_thread() / 32]; }
inline int my_lane() { return linear_thread() % 32; }
inline unsigned char* block_shared() { return tl_block->smem.data(); }
inline void grid_sync() { grid_barrier(); }

// The race check's tag of the 16 bytes at `p`, or -1 outside the watched memory.
inline ptrdiff_t shared_tag(const void* p) {
  const Block& b = *tl_block;
  const auto* c = static_cast<const unsigned char*>(p);
  if (b.shared_base == nullptr || c < b.shared_base) return -1;
  const ptrdiff_t tag = (c - b.shared_base) / 16;
  return tag < static_cast<ptrdiff_t>(b.written.size()) ? tag : -1;
}
[[noreturn]] inline void shared_race(const void* p, int writer, int reader) {
  fprintf(stderr,
          "shared-memory race: warp %d's cp.async into byte %td and warp %d's ldmatrix of it, between the same two "
          "barriers\n",
          writer, static_cast<const unsigned char*>(p) - tl_block->shared_base, reader);
  abort();
}
// A cp.async by this thread's warp into `dst`: none of this epoch's readers but itself.
inline void note_copy(const void* dst) {
  const ptrdiff_t tag = shared_tag(dst);
  if (tag < 0) return;
  Block& b = *tl_block;
  const uint64_t epoch = b.epoch.load(std::memory_order_relaxed);
  const int warp = linear_thread() / 32;
  const uint64_t r = b.read[tag].load(std::memory_order_relaxed);
  const uint32_t others = static_cast<uint32_t>(r) & ~(1u << warp);
  if ((r >> 32) == epoch && others != 0) shared_race(dst, warp, __builtin_ctz(others));
  b.written[tag].store(epoch << 32 | static_cast<uint64_t>(warp + 1), std::memory_order_relaxed);
}
// An ldmatrix row read by warp `warp`: no other warp's cp.async into it this epoch.
inline void note_read(const void* row, int warp) {
  const ptrdiff_t tag = shared_tag(row);
  if (tag < 0) return;
  Block& b = *tl_block;
  const uint64_t epoch = b.epoch.load(std::memory_order_relaxed);
  const uint64_t w = b.written[tag].load(std::memory_order_relaxed);
  if ((w >> 32) == epoch && static_cast<int>(w & 0xffffffffu) != warp + 1) {
    shared_race(row, static_cast<int>(w & 0xffffffffu) - 1, warp);
  }
  uint64_t r = b.read[tag].load(std::memory_order_relaxed);
  uint64_t next;
  do {
    next = ((r >> 32) == epoch ? r : epoch << 32) | (1ull << warp);
  } while (!b.read[tag].compare_exchange_weak(r, next, std::memory_order_relaxed));
}
}  // namespace emulated

#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#define threadIdx (::emulated::tl_thread_idx)
#define blockIdx (::emulated::tl_block_idx)
#define blockDim (::emulated::tl_block_dim)
#define gridDim (::emulated::tl_grid_dim)

inline void __syncthreads() { emulated::tl_block->bar.arrive_and_wait(); }

inline void __syncwarp(unsigned = 0xffffffffu) { emulated::my_warp().bar.arrive_and_wait(); }

namespace emulated {
// __syncthreads_count: a barrier that also counts the threads whose
// predicate is non-zero (four barriers: nobody counts before the count is
// cleared, or clears it before everyone has read it).
inline int syncthreads_count(int predicate) {
  Block& b = *tl_block;
  b.bar.arrive_and_wait();
  if (linear_thread() == 0) b.votes.store(0);
  b.bar.arrive_and_wait();
  if (predicate) b.votes.fetch_add(1);
  b.bar.arrive_and_wait();
  const int count = b.votes.load();
  b.bar.arrive_and_wait();
  return count;
}
}  // namespace emulated
inline int __syncthreads_or(int predicate) { return emulated::syncthreads_count(predicate) > 0 ? 1 : 0; }
inline int __syncthreads_and(int predicate) {
  const int threads = static_cast<int>(emulated::tl_block_dim.x * emulated::tl_block_dim.y * emulated::tl_block_dim.z);
  return emulated::syncthreads_count(predicate) == threads ? 1 : 0;
}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  auto& w = emulated::my_warp();
  const int lane = emulated::my_lane();
  w.shfl[lane] = static_cast<double>(v);
  w.bar.arrive_and_wait();
  const T r = static_cast<T>(w.shfl[lane ^ mask]);
  w.bar.arrive_and_wait();
  return r;
}

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
// Loads that bypass L1: plain loads here (every thread sees host memory).
template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}
using std::max;
using std::min;

#include "emulated_mma.h"

namespace emulated {

inline void cp_async(void* dst, const void* src, bool valid, size_t bytes = 16) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    fprintf(stderr, "cp.async: unaligned\n");
    abort();
  }
  note_copy(dst);
  tl_open.push_back({dst, src, valid, bytes});
}
inline void cp_async_commit() {
  tl_committed.push_back(std::move(tl_open));
  tl_open.clear();
}
// Copies land as late as the program allows: when a wait makes them due.
inline void cp_async_wait(int pending) {
  while (static_cast<int>(tl_committed.size()) > pending) {
    for (const Copy& c : tl_committed.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, c.bytes);
      else
        std::memset(c.dst, 0, c.bytes);
    }
    tl_committed.erase(tl_committed.begin());
  }
}

// The OS threads that play CUDA threads, kept from launch to launch (a
// kernel a time step launches thousands of times). run(n, job) runs job(i)
// on threads 0..n-1 and returns when all have finished.
class Threads {
 public:
  ~Threads() {
    stop_ = true;
    for (auto& w : workers_) w->go.release();
    for (auto& w : workers_) w->thread.join();
  }
  void run(unsigned n, const std::function<void(unsigned)>& job) {
    while (workers_.size() < n) {
      auto w = std::make_unique<Worker>();
      const unsigned id = static_cast<unsigned>(workers_.size());
      w->thread = std::thread([this, id, go = &w->go] {
        for (;;) {
          go->acquire();
          if (stop_) return;
          (*job_)(id);
          if (remaining_.fetch_sub(1) == 1) done_.release();
        }
      });
      workers_.push_back(std::move(w));
    }
    job_ = &job;
    remaining_ = n;
    for (unsigned i = 0; i < n; ++i) workers_[i]->go.release();
    done_.acquire();
  }

 private:
  struct Worker {
    std::binary_semaphore go{0};
    std::thread thread;
  };
  std::vector<std::unique_ptr<Worker>> workers_;
  const std::function<void(unsigned)>* job_ = nullptr;
  std::atomic<unsigned> remaining_{0};
  std::binary_semaphore done_{0};
  std::atomic<bool> stop_{false};
};
inline Threads threads_pool;

inline void run_thread(Block& block, dim3 grid, dim3 block_dim, unsigned tid, uint3 block_idx) {
  tl_grid_dim = grid;
  tl_thread_idx = uint3{tid % block_dim.x, tid / block_dim.x, 0};
  tl_block_idx = block_idx;
  tl_block_dim = block_dim;
  tl_block = &block;
  tl_committed.clear();
  tl_open.clear();
}
inline void check_copies_done() {
  if (!tl_committed.empty() || !tl_open.empty()) {
    fprintf(stderr, "cp.async left pending\n");
    abort();
  }
}

// Runs kernel(args...) over the grid, one block after another, `smem` (of
// `smem_capacity` bytes, refilled with NaN bytes for each block) as every
// block's dynamic shared memory. The same threads run every block: a barrier
// ends each block before the next begins.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, dim3 block_dim, size_t smem_bytes, unsigned char* smem, size_t smem_capacity,
            const Args&... args) {
  if (smem_bytes > smem_capacity) {
    fprintf(stderr, "smem too large\n");
    abort();
  }
  const unsigned threads = block_dim.x * block_dim.y * block_dim.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  auto fresh_smem = [=]() noexcept {
    if (smem) std::memset(smem, 0xff, smem_capacity);
  };
  fresh_smem();
  Block block(static_cast<int>(threads));
  if (smem) block.watch_shared(smem, smem_bytes);
  auto next_block = [&]() noexcept {  // its shared memory fresh, its race epoch new
    fresh_smem();
    block.epoch.fetch_add(1, std::memory_order_relaxed);
  };
  std::barrier<decltype(next_block)> block_done(static_cast<std::ptrdiff_t>(threads), next_block);
  threads_pool.run(threads, [&](unsigned tid) {
    for (unsigned b = 0; b < blocks; ++b) {
      run_thread(block, grid, block_dim, tid, uint3{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)});
      kernel(args...);
      check_copies_done();
      block_done.arrive_and_wait();
    }
  });
}

// Runs kernel(args...) with every block of the grid at once (a cooperative
// launch): grid_sync() waits for all of them; each block has `smem_bytes` of
// dynamic shared memory of its own (block_shared()), starting as NaN bytes.
template <typename Kernel, typename... Args>
void launch_cooperative(Kernel kernel, dim3 grid, dim3 block_dim, size_t smem_bytes, const Args&... args) {
  const unsigned threads = block_dim.x * block_dim.y * block_dim.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  std::vector<std::unique_ptr<Block>> all;
  for (unsigned b = 0; b < blocks; ++b) all.emplace_back(std::make_unique<Block>(static_cast<int>(threads), smem_bytes));
  auto grid_phase = [&]() noexcept {  // a grid barrier is every block's barrier too
    for (auto& b : all) b->epoch.fetch_add(1, std::memory_order_relaxed);
  };
  std::barrier<decltype(grid_phase)> grid_bar(static_cast<std::ptrdiff_t>(threads * blocks), grid_phase);
  grid_barrier = [&grid_bar] { grid_bar.arrive_and_wait(); };
  threads_pool.run(threads * blocks, [&](unsigned i) {
    const unsigned b = i / threads;
    run_thread(*all[b], grid, block_dim, i % threads, uint3{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)});
    kernel(args...);
    check_copies_done();
  });
  grid_barrier = nullptr;  // the barrier it named is gone
}
}  // namespace emulated
