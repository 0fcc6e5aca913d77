// scripts/gpu.sh --racecheck's first probe: a kernel that cannot race (each
// thread writes its own element, then reads it back after a barrier), so
// that a hazard or an error racecheck reports here is the sanitizer's, or
// the machine's, and not a kernel's of Conveyor. Prints PASS when the
// result is right.
#include <cstdio>

__global__ void own_elements(float* out, int n) {
  __shared__ float tile[256];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = static_cast<float>(i);
  __syncthreads();
  if (i < n) out[i] = tile[threadIdx.x] * 2.0f;
}

int main() {
  const int n = 1 << 16;
  float* out = nullptr;
  if (cudaMalloc(&out, n * sizeof(float)) != cudaSuccess) return 1;
  own_elements<<<n / 256, 256>>>(out, n);
  float host[4] = {};
  const cudaError_t status = cudaMemcpy(host, out + n - 4, sizeof(host), cudaMemcpyDeviceToHost);
  cudaFree(out);
  const bool ok = status == cudaSuccess && host[3] == 2.0f * (n - 1);
  std::printf("%s\n", ok ? "PASS" : "FAIL: wrong result or a CUDA error");
  return ok ? 0 : 1;
}
