#pragma once
// Runs the attention kernels' CUDA C++ on the host, so that their indexing,
// fragment layouts, masking and synchronisation can be checked without a GPU.
// Force-included (-include) before the kernel headers; compiled by the host
// compiler against the CUDA toolkit's headers (for __half, __nv_bfloat16).
//
// One std::thread per CUDA thread; the blocks of a grid run one after another,
// sharing one array as their shared memory, which starts as NaN bytes.
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
#include <memory>
#include <thread>
#include <vector>

namespace emulated {
struct Warp {
  std::barrier<> bar{32};
  const void* addr[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
  double shfl[32];
};
struct Block {
  explicit Block(int threads) : bar(threads) {
    for (int i = 0; i < (threads + 31) / 32; ++i) warps.emplace_back(std::make_unique<Warp>());
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<Warp>> warps;
};
struct Copy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local uint3 tl_thread_idx, tl_block_idx;
inline thread_local Block* tl_block = nullptr;
inline thread_local std::vector<std::vector<Copy>> tl_committed;
inline thread_local std::vector<Copy> tl_open;
inline std::atomic<long> collective_count{0};

inline Warp& my_warp() { return *tl_block->warps[tl_thread_idx.x / 32]; }
inline int my_lane() { return tl_thread_idx.x % 32; }
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

inline void __syncthreads() { emulated::tl_block->bar.arrive_and_wait(); }

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

inline void cp_async(void* dst, const void* src, bool valid) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) {
    fprintf(stderr, "cp.async: unaligned\n");
    abort();
  }
  tl_open.push_back({dst, src, valid});
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
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
    }
    tl_committed.erase(tl_committed.begin());
  }
}

// Runs kernel(params) over the grid.
template <typename Params, typename Kernel>
void launch(Kernel kernel, dim3 grid, int threads, size_t smem_bytes, unsigned char* smem, size_t smem_capacity,
            const Params& params) {
  if (smem_bytes > smem_capacity) {
    fprintf(stderr, "smem too large\n");
    abort();
  }
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(smem, 0xff, smem_capacity);
        Block block(threads);
        std::vector<std::thread> ts;
        for (int tid = 0; tid < threads; ++tid) {
          ts.emplace_back([&, tid] {
            tl_thread_idx = uint3{static_cast<unsigned>(tid), 0, 0};
            tl_block_idx = uint3{x, y, z};
            tl_block = &block;
            tl_committed.clear();
            tl_open.clear();
            kernel(params);
            if (!tl_committed.empty() || !tl_open.empty()) {
              fprintf(stderr, "cp.async left pending\n");
              abort();
            }
          });
        }
        for (auto& t : ts) t.join();
      }
}
}  // namespace emulated
