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
// stale NaNs instead of passing by luck. Not emulated: memory-ordering races
// between warps other than through these points.
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
struct Block {
  explicit Block(int threads, size_t smem_bytes = 0) : bar(threads), smem(smem_bytes, 0xff) {
    for (int i = 0; i < (threads + 31) / 32; ++i) warps.emplace_back(std::make_unique<Warp>(std::min(32, threads - 32 * i)));
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
  std::vector<unsigned char> smem;  // launch_cooperative's: each block's own
  std::atomic<int> votes{0};        // __syncthreads_or/_and's count
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
inline std::barrier<>* grid_barrier = nullptr;  // launch_cooperative's
inline thread_local std::vector<std::vector<Copy>> tl_committed;
inline thread_local std::vector<Copy> tl_open;
inline std::atomic<long> collective_count{0};

inline int linear_thread() { return static_cast<int>(tl_thread_idx.x + tl_block_dim.x * tl_thread_idx.y); }
inline Warp& my_warp() { return *tl_block->warps[linear_thread() / 32]; }
inline int my_lane() { return linear_thread() % 32; }
inline unsigned char* block_shared() { return tl_block->smem.data(); }
inline void grid_sync() { grid_barrier->arrive_and_wait(); }
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

namespace emulated {
inline uint16_t element16(const void* row, int i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(row) + 2 * i, 2);
  return v;
}
// PTX ldmatrix .x4: lanes 8i..8i+7 give matrix i's row addresses. Without
// .trans lane l receives row l/4, cols 2(l%4), 2(l%4)+1; with .trans it
// receives rows 2(l%4), 2(l%4)+1 of col l/4.
inline void ldmatrix(uint32_t (&r)[4], const void* smem, bool trans) {
  auto& w = my_warp();
  const int lane = my_lane();
  if (reinterpret_cast<uintptr_t>(smem) % 16 != 0) {
    fprintf(stderr, "ldmatrix: unaligned row address\n");
    abort();
  }
  w.addr[lane] = smem;
  w.bar.arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const void* row = w.addr[8 * i + g];
      lo = element16(row, 2 * t);
      hi = element16(row, 2 * t + 1);
    } else {
      lo = element16(w.addr[8 * i + 2 * t], g);
      hi = element16(w.addr[8 * i + 2 * t + 1], g);
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  w.bar.arrive_and_wait();
  collective_count++;
}

template <bool kBF16>
inline float to_float(uint16_t bits) {
  if constexpr (kBF16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  } else {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
}

// PTX mma.m16n8k16 fragment layouts, from the ISA's formulas.
template <bool kBF16>
inline void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& w = my_warp();
  const int lane = my_lane();
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) w.b[lane][i] = b[i];
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l % 4;
    for (int i = 0; i < 8; ++i) {  // a_i
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = (i < 4) ? 2 * t + (i & 1) : 2 * t + (i & 1) + 8;
      const uint32_t reg = w.a[l][i / 2];
      A[row][col] = to_float<kBF16>(static_cast<uint16_t>((i & 1) ? reg >> 16 : reg & 0xffff));
    }
    for (int i = 0; i < 4; ++i) {  // b_i
      const int row = (i < 2) ? 2 * t + (i & 1) : 2 * t + (i & 1) + 8;
      const int col = g;
      const uint32_t reg = w.b[l][i / 2];
      B[row][col] = to_float<kBF16>(static_cast<uint16_t>((i & 1) ? reg >> 16 : reg & 0xffff));
    }
  }
  const int g = lane >> 2, t = lane % 4;
  for (int i = 0; i < 4; ++i) {  // c_i: row g for i < 2 else g + 8; col 2t + (i & 1)
    const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
    double acc = d[i];
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
    d[i] = static_cast<float>(acc);
  }
  w.bar.arrive_and_wait();
  collective_count++;
}

// cvt.rna.tf32.f32: to nearest with ties away from zero, 10 mantissa bits
// kept (adding half of the dropped bits' unit to the magnitude, then dropping them).
inline float round_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &bits, 4);
  return x;
}
// What a tensor core reads of a TF32 operand: the low 13 bits are ignored.
inline float tf32_operand(uint32_t bits) {
  bits &= 0xffffe000u;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// PTX mma.m16n8k8 with .tf32 operands, from the ISA's fragment formulas
// (g = lane / 4, t = lane % 4): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4],
// a3 = A[g+8][t+4]; b0 = B[t][g], b1 = B[t+4][g]; c as in m16n8k16.
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  auto& w = my_warp();
  const int lane = my_lane();
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) w.b[lane][i] = b[i];
  w.bar.arrive_and_wait();
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l % 4;
    A[g][t] = tf32_operand(w.a[l][0]);
    A[g + 8][t] = tf32_operand(w.a[l][1]);
    A[g][t + 4] = tf32_operand(w.a[l][2]);
    A[g + 8][t + 4] = tf32_operand(w.a[l][3]);
    B[t][g] = tf32_operand(w.b[l][0]);
    B[t + 4][g] = tf32_operand(w.b[l][1]);
  }
  const int g = lane >> 2, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = i < 2 ? g : g + 8, col = 2 * t + (i & 1);
    double acc = d[i];
    for (int k = 0; k < 8; ++k) acc += static_cast<double>(A[row][k]) * B[k][col];
    d[i] = static_cast<float>(acc);
  }
  w.bar.arrive_and_wait();
  collective_count++;
}

inline void cp_async(void* dst, const void* src, bool valid, size_t bytes = 16) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    fprintf(stderr, "cp.async: unaligned\n");
    abort();
  }
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
  std::barrier<decltype(fresh_smem)> block_done(static_cast<std::ptrdiff_t>(threads), fresh_smem);
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
  std::barrier<> grid_bar(static_cast<std::ptrdiff_t>(threads * blocks));
  grid_barrier = &grid_bar;
  std::vector<std::unique_ptr<Block>> all;
  for (unsigned b = 0; b < blocks; ++b) all.emplace_back(std::make_unique<Block>(static_cast<int>(threads), smem_bytes));
  threads_pool.run(threads * blocks, [&](unsigned i) {
    const unsigned b = i / threads;
    run_thread(*all[b], grid, block_dim, i % threads, uint3{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)});
    kernel(args...);
    check_copies_done();
  });
  grid_barrier = nullptr;
}
}  // namespace emulated
