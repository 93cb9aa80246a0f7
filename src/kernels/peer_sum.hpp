// The element-wise sum of a small float32 tensor over the GPUs of one host, straight through
// peer memory (NVLink): the collective SyncBN and the loss normalisers take hundreds of times per
// training step, where a library collective costs a kernel of its own plus two cross-stream
// hand-offs each time.
//
// Every rank owns one exchange buffer, mapped into every other rank's process by CUDA IPC:
//   [0, 128)     flags: uint64 per source rank, the number of sums that rank has delivered here
//   [128, 136)   this rank's own count of sums started (read and written by its kernels only)
//   [256, ...)   rows: two halves (by the sum's parity) x world rows x `capacity` floats
// One kernel per sum, on the caller's stream: it writes the tensor into its row of every peer's
// buffer, raises its flag there (release, system scope), waits for every peer's flag to reach the
// same count (acquire), then replaces the tensor by the rows' sum in rank order, so every rank gets
// the same bits. The count lives in device memory, so the kernel can be captured in a CUDA graph
// and replayed. Ranks must make the same sums in the same order (as with any collective).
//
// Why two halves are enough: a rank writes half p of sum g+2 only after finishing sum g+1, which
// needed every peer's flag for g+1, which a peer raises after its kernel for sum g has finished
// reading half p.
//
// Plain pointers and a cudaStream_t only; dist/peer_sum.cpp is the torch side.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace libreyolo::kernels {

constexpr int kPeerSumMaxWorld = 16;

struct PeerSumArgs {
  void* base[kPeerSumMaxWorld] = {};  // every rank's buffer, as mapped in this process
  int rank = 0, world = 1;
  int64_t capacity = 0;               // floats per row
  uint64_t timeout_ns = 0;            // a wait longer than this traps (0: wait forever)
};

size_t peer_sum_buffer_bytes(int world, int64_t capacity);

// The buffer of this process on `device`, zeroed; nullptr and `error` set on failure.
void* peer_sum_alloc(int device, size_t bytes, std::string* error);
void peer_sum_free(void* p);
// Its CUDA IPC handle (64 bytes), and another process's buffer opened from one.
bool peer_sum_handle(void* p, std::string* handle, std::string* error);
void* peer_sum_open(int device, const std::string& handle, std::string* error);
void peer_sum_close(void* p);

// t (n <= capacity floats, on this rank's device) := sum over ranks; enqueued on `stream`.
void peer_sum_float(float* t, int64_t n, const PeerSumArgs& a, cudaStream_t stream);

}  // namespace libreyolo::kernels
