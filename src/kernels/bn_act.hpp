// Fused training-mode BatchNorm (+ optional SiLU) over NHWC (channels_last) activations, as
// four CUDA kernels: two for forward, two for backward (SyncBN adds one that merges the processes' statistics). Plain pointers and a cudaStream_t only,
// so that the .cu file needs no torch headers; src/models/fused_conv.cpp is the torch side.
//
// x is an [M, C] row-major matrix (M = N*H*W). Statistics are per channel over the M rows.
// Each reduction is a grid of row-blocks that write partial results to `partials` and
// take a ticket from `counters` (one per channel block, zero on entry); the last row-block
// of a channel block merges the partials, writes the per-channel result and sets its counter
// back to zero, so the counters need no memset between launches on the same stream. Nothing
// synchronises with the host, so the kernels can be captured in a CUDA graph.
#pragma once
#include <cstdint>

typedef struct CUstream_st* cudaStream_t;

namespace libreyolo::kernels {

enum class DType : int { Float32 = 0, Float16 = 1, BFloat16 = 2 };

struct BnActLaunch {
  int64_t rows = 0;        // M
  int channels = 0;        // C
  int row_blocks = 0;      // P, from bn_act_row_blocks()
  DType dtype = DType::Float32;
  bool act = true;         // SiLU after the affine transform
  cudaStream_t stream = nullptr;
  // Channels per thread, accessed as one vector: 1, 4 or bn_act_max_vector_width() (8), when C is
  // a multiple of it and every pointer of the launch is aligned to vec * sizeof(element).
  int vec = 1;
  // SyncBN backward (bn_act_backward_reduce/elemt below): the second half of dsum carries
  // sum(g * (x - mean)) instead of sum(g * xhat), the form every process can add up.
  bool sync_sums = false;
  // Channel groups per block of the two reductions (statistics, backward sums): 0 = the default
  // (bn_act_reduce_block_channels() channels); else a power of two <= 32, clamped to the channel
  // count. row_blocks and the counters must come from the same value.
  int block_groups = 0;
  // Backward only: dy's row stride in elements (0 = channels). A channel slice of a wider NHWC
  // tensor (the gradient a concatenation hands each of its inputs) is read where it lies instead of
  // being copied first; with vec > 1 it must be a multiple of vec.
  int64_t dy_ld = 0;
  // An [M, C] tensor of dtype (packed, row stride C) added in the forward's apply, or nullptr:
  //  - addend_after_act false: to the BatchNorm output before the activation, y = act(bn(x) + a)
  //    (RepConvN's two branches summed, then SiLU). The backward reads it too (SiLU's input is
  //    recomputed), and the elementwise launch writes the gradient at the sum to `daddend` (null:
  //    not wanted), which is the addend's gradient;
  //  - addend_after_act true: after the activation, y = act(bn(x)) + a (a residual). The backward
  //    does not read it: its gradient is dy itself.
  const void* addend = nullptr;
  bool addend_after_act = false;
  void* daddend = nullptr;
};

constexpr int bn_act_max_vector_width() { return 8; }
// The vector width a launch takes for C channels (the caller still checks pointer alignment): 4
// when C is a multiple of 4, else 1. bench_bn_act at batch 32 on an H200 (25 shapes, 16-256
// channels, 20-320 px, bf16), summed us, width 8 against 4: statistics 1,631 / 1,578, apply
// 3,396 / 3,242, backward sums 5,487 / 4,584, input gradient 5,955 / 4,834 (with 8 channels a
// thread needs ~100 registers: two blocks per SM). Width 8 remains available (LIBREYOLO_BN_VEC=8).
int bn_act_vector_width(int channels);
// The kernels' fallback grid when a launch names none (block_groups 0): channels per block and
// rows per thread. Training steps name theirs (bn_act_reduce_grid_for below);
// LIBREYOLO_BN_BLOCK_CHANNELS and LIBREYOLO_BN_ROWS_PER_THREAD set one grid for every launch of a
// step instead (layers/conv_bn_act.cpp), for measurements.
constexpr int bn_act_reduce_block_channels() { return 256; }
constexpr int bn_act_rows_per_thread() { return 4; }
// The reductions' grid a training step uses for an [rows, channels] activation, by its size
// (elements = rows * channels), from bench_bn_act's sweep on an H200 (bf16, batch 8 and 32, 16-256
// channels, 20-320 px; statistics + backward sums per launch, summed over the 25 shapes: 2.61 ms with
// 256 channels x 4 rows, 2.02 ms with the best grid of each shape):
//   < 2^21 elements: 64 channels per block, 4 rows per thread (a short merge: few row-blocks);
//   < 5 * 2^20: 64 x 8; < 20 * 2^20: 32 x 16 (fewer partials to merge); larger: 64 x 4 (the
//   1,024-block cap binds, more rows per thread only lengthens each block).
struct BnActGrid {
  int block_groups = 0;     // channel groups of `vec` channels per block (BnActLaunch::block_groups)
  int rows_per_thread = 0;  // for bn_act_row_blocks()
};
BnActGrid bn_act_reduce_grid_for(int64_t rows, int channels, int vec);
// Number of row-blocks for a launch (the size of the partials' P dimension); 0 = the defaults.
int bn_act_row_blocks(int64_t rows, int channels, int vec, int block_groups = 0, int rows_per_thread = 0);
// Counters needed for a launch (one per channel block). bn_act_max_counters() bounds it.
int bn_act_counters(int channels, int vec, int block_groups = 0);
constexpr int bn_act_max_counters() { return 4096; }
// Bound on P * C over every launch: P <= max(1, 1024 / channel_blocks) row-blocks of at most 32
// channel groups of `vec` channels each.
constexpr long long bn_act_max_partials_per_plane() { return 1024LL * 32 * bn_act_max_vector_width(); }

// Forward. partials: 3*P*C floats (scratch). mean/invstd: C floats each (out, kept for backward).
// running_mean/var (C floats) are updated in place with `momentum`, the variance unbiased.
// y: [M, C] of dtype.
void bn_act_forward(const BnActLaunch& l, const void* x, const float* gamma, const float* beta,
                    float* running_mean, float* running_var, float momentum, float eps,
                    float* partials, unsigned* counters, float* mean, float* invstd, void* y);

// Backward, in two launches: the reduction, then the elementwise input gradient.
// dy, x: [M, C] of dtype. partials: 2*P*C floats (scratch). dgamma/dbeta: C floats, written
// (accumulate=false) or added to (accumulate=true); either may be null (not wanted). dsum: 2*C
// floats, [sum g, sum g * xhat] (g: the gradient at BatchNorm's output), written by the reduction
// and read by the elementwise launch. dx: [M, C] of dtype, or null when only l.daddend is wanted.
// With l.sync_sums (SyncBN) the second half of dsum is sum(g * (x - mean)), the form every process
// can add up: the caller all-reduces dsum in between, and `count` (a device float; null: l.rows) is
// the global row count.
void bn_act_backward_reduce(const BnActLaunch& l, const void* dy, const void* x, const float* gamma,
                            const float* beta, const float* mean, const float* invstd, float* partials,
                            unsigned* counters, float* dsum, float* dgamma, float* dbeta, bool accumulate);
void bn_act_backward_elemt(const BnActLaunch& l, const void* dy, const void* x, const float* gamma,
                           const float* beta, const float* mean, const float* invstd, const float* dsum,
                           const float* count, void* dx);

// ---- SyncBN forward: the same kernels split around a cross-process all-reduce.
// bn_act_local_stats writes this process's statistics into `row` (2C+1 floats:
// mean[C], invstd[C] = rsqrt(var + eps), count), one row of a zeroed [world, 2C+1] buffer that
// an all-reduce sum turns into every process's row. bn_act_forward_merged merges the `world`
// rows (Chan's parallel variance; a row with count 0 is skipped), writes stats = [mean[C],
// invstd[C], count] (2C+1 floats) of the global batch, updates the running statistics (variance
// unbiased over the global count) and applies the affine transform (+ SiLU) into y.
void bn_act_local_stats(const BnActLaunch& l, const void* x, float eps, float* partials, unsigned* counters,
                        float* row);
void bn_act_forward_merged(const BnActLaunch& l, const void* x, const float* rows, int world, const float* gamma,
                           const float* beta, float* running_mean, float* running_var, float momentum, float eps,
                           float* stats, void* y);

// ---- Two branches summed before the activation, in one set of launches: y = act(bn1(x1) + bn2(x2))
// (RepConvN: a 3x3 and a 1x1 convolution of one input, each with its own BatchNorm). x1, x2 and y
// are packed [M, C] of l.dtype; l.addend is not used by these. The forward is
// one statistics launch per branch (as bn_act_forward's) and one apply reading both; the backward
// reduction sums g, g * xhat1 and g * xhat2 in one pass over dy, x1 and x2 (g: the gradient at the
// sum), and the elementwise launch writes both branches' input gradients.
struct BnBranch {
  const void* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* running_mean = nullptr;  // forward: updated in place
  float* running_var = nullptr;
  float* mean = nullptr;          // forward: written; backward: read
  float* invstd = nullptr;
};
// partials: 3*P*C floats (scratch), counters as for bn_act_forward.
void bn_act_dual_forward(const BnActLaunch& l, const BnBranch& b1, const BnBranch& b2, float momentum, float eps,
                         float* partials, unsigned* counters, void* y);
// partials: 3*P*C floats; dsum: 3*C floats [sum g, sum g*xhat1, sum g*xhat2] (written, read by the
// elementwise launch); dgamma/dbeta of each branch written or added to (accumulate), or null.
void bn_act_dual_backward_reduce(const BnActLaunch& l, const void* dy, const BnBranch& b1, const BnBranch& b2,
                                 float* partials, unsigned* counters, float* dsum, float* dgamma1, float* dbeta1,
                                 float* dgamma2, float* dbeta2, bool accumulate);
// dx1, dx2: [M, C] of dtype (either may be null: not wanted).
void bn_act_dual_backward_elemt(const BnActLaunch& l, const void* dy, const BnBranch& b1, const BnBranch& b2,
                                const float* dsum, void* dx1, void* dx2);

}  // namespace libreyolo::kernels
