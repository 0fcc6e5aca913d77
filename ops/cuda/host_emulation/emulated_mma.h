#pragma once
// The tensor-core instructions of the host emulation: ldmatrix and mma.sync,
// each computing what the PTX ISA specifies for every lane of the warp.
// emulated_cuda.h includes this once its warps and thread state are declared.
#include <cstdint>
#include <cstring>

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
  if (lane == 0) {
    for (int l = 0; l < 32; ++l) note_read(w.addr[l], linear_thread() / 32);
  }
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
}  // namespace emulated
