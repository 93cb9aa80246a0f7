#include "kernels/peer_sum.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>

namespace libreyolo::kernels {

namespace {

constexpr size_t kFlagsBytes = 128, kCounterOffset = 128, kRowsOffset = 256;
static_assert(kPeerSumMaxWorld * sizeof(uint64_t) <= kFlagsBytes, "flags do not fit");

__device__ __forceinline__ uint64_t* flags_of(void* base) { return static_cast<uint64_t*>(base); }

__device__ __forceinline__ float* row_of(void* base, int64_t capacity, int world, int parity, int rank) {
  return reinterpret_cast<float*>(static_cast<unsigned char*>(base) + kRowsOffset) +
         (static_cast<int64_t>(parity) * world + rank) * capacity;
}

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void peer_sum_kernel(float* t, int64_t n, PeerSumArgs a) {
  __shared__ uint64_t gen_shared;
  const int me = a.rank;
  void* mine = a.base[me];
  uint64_t* counter = reinterpret_cast<uint64_t*>(static_cast<unsigned char*>(mine) + kCounterOffset);
  if (threadIdx.x == 0) gen_shared = *counter + 1;
  __syncthreads();
  const uint64_t gen = gen_shared;
  const int parity = static_cast<int>(gen & 1);
  // This rank's values into its row of every peer's buffer.
  for (int r = 0; r < a.world; ++r) {
    if (r == me) continue;
    float* dst = row_of(a.base[r], a.capacity, a.world, parity, me);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = t[i];
  }
  __threadfence_system();
  __syncthreads();
  // One thread per peer: raise this rank's flag there, then wait for the peer's flag here.
  const int r = static_cast<int>(threadIdx.x);
  if (r < a.world && r != me) {
    store_release_sys(flags_of(a.base[r]) + me, gen);
    const uint64_t* flag = flags_of(mine) + r;
    if (load_acquire_sys(flag) < gen) {
      const uint64_t start = now_ns();
      while (load_acquire_sys(flag) < gen)
        if (a.timeout_ns != 0 && now_ns() - start > a.timeout_ns) __trap();
    }
    __threadfence();
  }
  __syncthreads();
  // The sum in rank order: the same bits on every rank.
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < a.world; ++k) {
      const float v = k == me ? t[i] : row_of(mine, a.capacity, a.world, parity, k)[i];
      s = k == 0 ? v : s + v;
    }
    t[i] = s;
  }
  if (threadIdx.x == 0) *counter = gen;
}

void check(cudaError_t e, const char* what, std::string* error) {
  if (e != cudaSuccess && error) *error = std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

size_t peer_sum_buffer_bytes(int world, int64_t capacity) {
  return kRowsOffset + 2 * static_cast<size_t>(world) * static_cast<size_t>(capacity) * sizeof(float);
}

void* peer_sum_alloc(int device, size_t bytes, std::string* error) {
  void* p = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    check(e, "cudaMalloc", error);
    return nullptr;
  }
  e = cudaMemset(p, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    check(e, "cudaMemset", error);
    cudaFree(p);
    return nullptr;
  }
  return p;
}

void peer_sum_free(void* p) {
  if (p) cudaFree(p);
}

bool peer_sum_handle(void* p, std::string* handle, std::string* error) {
  cudaIpcMemHandle_t h;
  const cudaError_t e = cudaIpcGetMemHandle(&h, p);
  if (e != cudaSuccess) {
    check(e, "cudaIpcGetMemHandle", error);
    return false;
  }
  handle->assign(reinterpret_cast<const char*>(&h), sizeof(h));
  return true;
}

void* peer_sum_open(int device, const std::string& handle, std::string* error) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    if (error) *error = "malformed CUDA IPC handle";
    return nullptr;
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    check(e, "cudaIpcOpenMemHandle", error);
    cudaGetLastError();  // not sticky: clear it so that the next launch does not report it
    return nullptr;
  }
  return p;
}

void peer_sum_close(void* p) {
  if (p) cudaIpcCloseMemHandle(p);
}

void peer_sum_float(float* t, int64_t n, const PeerSumArgs& a, cudaStream_t stream) {
  if (n < 0 || n > a.capacity || a.world < 1 || a.world > kPeerSumMaxWorld || a.rank < 0 || a.rank >= a.world)
    throw std::invalid_argument("peer_sum_float: bad arguments");
  if (n == 0) return;
  int threads = static_cast<int>(n < 1024 ? ((n + 31) / 32) * 32 : 1024);
  if (threads < a.world) threads = ((a.world + 31) / 32) * 32;
  peer_sum_kernel<<<1, threads, 0, stream>>>(t, n, a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("peer_sum_float: ") + cudaGetErrorString(e));
}

}  // namespace libreyolo::kernels
