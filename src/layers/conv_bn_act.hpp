// Training-mode Conv2d(no bias) -> BatchNorm2d(batch statistics) -> optional SiLU as ONE
// autograd node, instead of the four nodes (weight cast, convolution, batch norm, SiLU) and
// three gradient accumulators that the composed ops record.
//
// Why: a YOLO training step is bound by the host, which pays per operator and per autograd node;
// a 3M-parameter detector's step has ~220 of these blocks. Inside the node:
//  - the convolution runs below autograd and autocast (the cast to the autocast dtype is done
//    here once), a 1x1/stride-1 one over NHWC memory as one GEMM;
//  - on CUDA with channels_last activations, BatchNorm+SiLU is four custom kernels in all
//    (statistics, apply; gradient sums, input gradient) that keep only the convolution output
//    for backward (the composed ops keep it and the BatchNorm output);
//  - elsewhere (CPU, NCHW) it is ATen's native_batch_norm and silu with their backward ops.
// Gradients of BatchNorm's weight and bias are written to (or added to) their .grad directly.
// The results equal the composed ops' (tests/test_conv_bn_act.cpp on CPU, the GPU test for the
// kernels); running statistics are updated the same way.
#pragma once
#include <torch/torch.h>

#include "core/cross_process.hpp"
#include "layers/sync_bn.hpp"
#include "layers/weight_grads.hpp"

namespace libreyolo::models {

struct ConvBnActParams {
  const torch::Tensor* weight = nullptr;  // [Cout, Cin/groups, k, k]
  // Optional copy of `weight` already in the autocast dtype (the model casts all of them with one
  // multi-tensor kernel per step); used when its dtype is the compute dtype.
  const torch::Tensor* weight_cast = nullptr;
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
  bool pointwise = false;  // 1x1, stride 1, groups 1
  const torch::Tensor* gamma = nullptr;
  const torch::Tensor* beta = nullptr;
  const torch::Tensor* running_mean = nullptr;
  const torch::Tensor* running_var = nullptr;
  double momentum = 0.1;
  double eps = 1e-5;
  bool act = true;
  // Optional tensor of the block's output sizes added inside the node, where the BatchNorm+SiLU
  // kernels add it in their elementwise pass: before the activation, y = act(bn(conv(x)) + addend)
  // (RepConvN's two branches summed, then SiLU), or with addend_after_act after it,
  // y = act(bn(conv(x))) + addend (a residual). Its gradient flows back through the node.
  const torch::Tensor* addend = nullptr;
  bool addend_after_act = false;
};

// Where a block's result goes: `residual`, when set, is added to it after the activation;
// `into`, when set, receives it (a view of the result's shape, typically a channel slice of a
// concatenation assembled in place, layers/concat.hpp) and is returned. Neither may overlap
// the block's input. Inference only: with autograd recording use the returned tensor as usual.
struct ConvOutput {
  const torch::Tensor* into = nullptr;
  const torch::Tensor* residual = nullptr;
};
// The composed form of a ConvOutput for a block's result z: the residual added to z in place,
// then z copied into `into` (returned) when set.
torch::Tensor finish_output(torch::Tensor z, const ConvOutput& o);

// A 1x1, stride-1, single-group convolution over NHWC (channels_last) CUDA memory is one GEMM
// [N*H*W, Cin] x [Cin, Cout] on views: same result, but cuBLAS costs the host a fraction of
// cuDNN's per-call overhead, forward and backward. conv1x1_gemm_applies() says whether x allows it.
bool conv1x1_gemm_applies(const torch::Tensor& x);
// The row stride (elements) of x seen as an [N*H*W, C] matrix when x is NHWC memory read as rows:
// C when packed, more for a channel slice of a wider NHWC tensor; 0 when it is neither.
int64_t nhwc_row_stride(const torch::Tensor& x);
torch::Tensor conv1x1_gemm(const torch::Tensor& x, const torch::Tensor& weight);
// The same with a bias and `groups` groups, recorded by autograd as one addmm over the rows (a
// grouped weight as its block-diagonal dense one): at::conv2d's result for a 1x1, stride-1
// convolution (e.g. a detection head's output layer) without cuDNN's autotuning of it and its
// gradients in every new process. x as conv1x1_gemm_applies() takes it; the result channels-last.
torch::Tensor conv1x1_bias_gemm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                int64_t groups);

// A grouped convolution's weight [K, C/g, R, S] as the equal dense one [K, C, R, S] (channels-last):
// output channel k keeps its group's input channels, every other tap is 0. diagonal_blocks() is
// the way back for a gradient: the dense weight's gradient [K, C, R, S] as the grouped weight's,
// in the memory format of `like` (the grouped weight).
torch::Tensor block_diagonal(const torch::Tensor& w, int64_t groups);
torch::Tensor diagonal_blocks(const torch::Tensor& dense, int64_t groups, const torch::Tensor& like);

// The inference forward of a BatchNorm-folded block (layers/fold.hpp): act(conv(x, weight)
// + bias) [+ residual], nothing recorded for autograd, below autocast (x is cast to weight's dtype
// once). On CUDA with this build's kernels: for channels-last groups-1 blocks in a dtype the fusion
// takes (float16/bfloat16; float32 under TF32: cudnn_fusion_takes) one cuDNN fused operation
// (layers/cudnn_fusion.hpp), otherwise the convolution (one GEMM for a 1x1/stride-1 one over NHWC
// memory, else cuDNN) then one bias+SiLU kernel in place; elsewhere
// ATen's convolution with its bias (a 1x1 one over NHWC CUDA memory as addmm), then SiLU in place.
// The residual is added after the activation (inside the fused operation, else in place).
struct ConvBiasActParams {
  const torch::Tensor* weight = nullptr;  // folded, in the compute dtype
  const torch::Tensor* bias = nullptr;    // [Cout], the compute dtype
  const torch::Tensor* bias32 = nullptr;  // [Cout], float32 (the CUDA epilogue's)
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t groups = 1;
  bool pointwise = false;  // 1x1, stride 1, groups 1
  bool act = true;
  ConvOutput output;       // where the result goes, what is added to it
};
torch::Tensor conv_bias_act(const torch::Tensor& x, const ConvBiasActParams& p);
// For a folded block of `groups` groups on input x computing in dtype/fmt: g (its weight to be
// folded as the equal dense one, common::FoldedConv::get) when that lets cuDNN's fused operation
// take it (it takes one group only): 2 to 4 groups, channels_last CUDA in a dtype the fusion takes
// (cudnn_fusion_takes), the fusion on; else 0. A dense weight does up to 4x the block's arithmetic
// in one kernel instead of a grouped convolution plus an epilogue pass.
int64_t fused_dense_groups(const torch::Tensor& x, int64_t groups, at::ScalarType dtype, at::MemoryFormat fmt);

// True when conv_bn_act_train() can take this block: autograd recording, and the node would be
// recorded (the input or the convolution weight requires grad). Otherwise use the composed ops.
bool conv_bn_act_applicable(const torch::Tensor& x, const ConvBnActParams& p);

torch::Tensor conv_bn_act_train(const torch::Tensor& x, const ConvBnActParams& p);

// RepConvN in training as one node: silu(bn1(conv1(x)) + bn2(conv2(x))), p1 the 3x3 branch (one
// group, no activation of its own), p2 the 1x1 one. Both BatchNorms and the sum run in one set of
// kernel passes (kernels/bn_act.hpp, BnBranch): one apply, one backward reduction and one input
// gradient pass for the pair, nothing of the 3x3 branch written in between, and the 1x1 branch's
// input gradient added into the 3x3's by its GEMM. Where it applies: autograd recording, CUDA with
// this build's kernels, channels-last input, no SyncBN installed, equal eps and momentum, and the
// switch on (LIBREYOLO_FUSED_REPCONVN=0 turns it off: two nodes, conv2's with conv1's output as its
// addend). The results equal the two-node form's up to float rounding.
bool repconvn_train_applicable(const torch::Tensor& x, const ConvBnActParams& p1, const ConvBnActParams& p2);
torch::Tensor repconvn_train(const torch::Tensor& x, const ConvBnActParams& p1, const ConvBnActParams& p2);
void set_fused_repconvn(bool on);

// Process-wide switch (default on; LIBREYOLO_FUSED_CONV=0 in the environment turns it off).
void set_fused_conv_training(bool on);
bool fused_conv_training();
// Whether this build has the CUDA kernels (else CUDA tensors use the ATen path).
bool fused_conv_cuda_kernels();
// Use the CUDA kernels where they apply (default on; LIBREYOLO_FUSED_CONV_KERNELS=0 turns them
// off, leaving the node on ATen's ops: for comparisons).
void set_fused_conv_kernels(bool on);
// A block's addend (RepConvN's second branch, a residual) added inside the fused node (default on;
// LIBREYOLO_FUSED_ADDEND=0 adds it outside, as separate ops: for comparisons).
void set_fused_addend(bool on);
bool fused_addend();

}  // namespace libreyolo::models
