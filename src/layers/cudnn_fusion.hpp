// Inference convolution + bias (+ SiLU) as one cuDNN operation graph (cuDNN's runtime fusion
// engines: the epilogue runs inside the convolution kernel instead of as a second pass over its
// output). Built with the cudnn_frontend headers (scripts/env.sh fetches them into its cache);
// without them, or on the CPU, cudnn_conv_bias_act() declines and callers keep their own path.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace libreyolo::models {

// False in builds without cudnn_frontend, and when LIBREYOLO_CUDNN_FUSION is 0, false or off.
bool cudnn_fusion_enabled();

// Whether the fused operation takes this dtype: float16 and bfloat16; float32 too while TF32
// convolutions are allowed (at::globalContext().allowTF32CuDNN(), PyTorch's default and ours unless
// LIBREYOLO_TF32=0): its engines run float32 on the tensor cores as TF32, as cuDNN's own float32
// convolutions do then; with TF32 off float32 keeps cuDNN's convolution and a separate epilogue.
bool cudnn_fusion_takes(at::ScalarType dtype);

// y = act(conv2d(x, w) + bias) [+ residual] (act = SiLU) in one cuDNN graph: x [N, C, H, W] channels-last
// float16/bfloat16 (float32: cudnn_fusion_takes) on CUDA, packed or a channel slice of a wider channels_last
// tensor; w [K, C, R, S] (groups 1) in x's dtype, bias float32 [K]; residual (optional) shaped and laid out
// like y, added after the activation. y is a new channels_last tensor, or `out` when given (a channels-last
// view of y's shape, e.g. a channel slice of a concatenation: y is written there and returned; it must not
// overlap x or the residual). Returns an undefined tensor when the fusion is off or cuDNN has no engine for
// this configuration (remembered per configuration: asked once); then nothing was written. Plans are cached
// per configuration, chosen by its first run: with cuDNN autotuning on (at::globalContext().benchmarkCuDNN(),
// e.g. under CudnnAutotuneScope) the fastest of the heuristics' first 4 (6 in float32), each timed in a CUDA
// graph, else the first that builds (LIBREYOLO_CUDNN_FUSION_CANDIDATES=N: N). cuDNN compiles a plan's kernel
// when it is built (~0.1 s; candidates build in parallel threads); chosen plans are kept on disk
// (LIBREYOLO_CUDNN_PLAN_CACHE, default ~/.cache/libreyolo-cpp/cudnn-plans; off: none), so a later process loads
// them instead. Never builds inside a CUDA graph capture (declines instead). Without autotuning (eager
// predict and val), a configuration whose plan is neither in memory nor on disk is declined while its plan
// is built in the background, so a first predict on a machine runs at once, unfused, and fuses as the plans
// arrive (LIBREYOLO_CUDNN_PLAN_BUILD=background, the default; =wait: built by the call).
torch::Tensor cudnn_conv_bias_act(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias32,
                                  int64_t stride, int64_t padding, bool act, const torch::Tensor& residual = {},
                                  const torch::Tensor& out = {});

// Training convolutions (layers/conv_bn_act.cpp, groups 1) through the same plan cache: one plain
// cuDNN convolution node per call, packed channels-last operands in a dtype cudnn_fusion_takes, the
// result a new channels-last tensor of out_sizes in that dtype:
//   Forward:   a = x [N, C, H, W], b = w [K, C, R, S], out_sizes = y's: y = conv2d(x, w);
//   InputGrad: a = dy (y's shape), b = w, out_sizes = x's: dx;
//   WeightGrad: a = dy, b = x, out_sizes = w's: dw.
// Plans are picked as above (the fastest of the heuristics' first 4 that build, timed in a CUDA graph,
// while autotuning is on) among engines cuDNN does not mark non-deterministic, and kept on disk, so
// that a later process on the machine skips the autotuning of its convolutions. Undefined (nothing
// written) when declined: LIBREYOLO_CUDNN_TRAIN_CONV=0, the fusion off, another layout or dtype, a
// misaligned operand, no engine; the caller then runs ATen's convolution.
enum class TrainConvOp { Forward = 0, InputGrad = 1, WeightGrad = 2 };
torch::Tensor cudnn_conv_train(TrainConvOp op, const torch::Tensor& a, const torch::Tensor& b, at::IntArrayRef out_sizes,
                               int64_t stride, int64_t padding);

// How a training convolution's plan is chosen while autotuning is on and none is on disk for its
// configuration. InCall (the default): the call builds and times the candidates, the step waits.
// Background (single-process training): the call builds the heuristics' first plan and runs it at
// once, while a worker thread builds and times the candidates on operands of its own (and keeps
// the fastest on disk) and hands it over; the configuration's next call outside a capture adopts
// it. A training step is captured only once no timing is left (cudnn_training_plans_settled())
// and no timed plan waits to be adopted (cudnn_adopt_timed_plans() adopted none: else that
// occurrence runs eager on them first), so that its graph holds the chosen plans.
// LIBREYOLO_CUDNN_PLAN_BUILD=wait keeps InCall.
// Process-wide; returns the mode it replaces (a trainer puts that back when it ends).
enum class PlanTuning { InCall, Background };
PlanTuning set_training_plan_tuning(PlanTuning tuning);

// False while a worker is timing a training configuration's candidates (PlanTuning::Background).
bool cudnn_training_plans_settled();

// Every timed plan handed over for the current device and not adopted yet takes its
// configuration's place now (made into a graph on this thread's cuDNN handle); how many did.
int64_t cudnn_adopt_timed_plans();

// Configurations planned so far (fused inference convolutions and training convolutions with a plan,
// and declined ones), for tests and benchmarks.
struct CudnnFusionStats {
  int64_t fused = 0, declined = 0;
  int64_t loaded = 0;   // of the fused: plans read from the on-disk plan cache instead of built
  double build_ms = 0;  // total time spent building (and timing) plans
  int64_t pending = 0;  // being built in the background (not yet counted above)
  // Training configurations run first on the heuristics' plan while theirs was timed on a worker
  // (PlanTuning::Background), and of those the ones whose timed plan has been adopted since.
  int64_t provisional = 0, adopted = 0;
  double timing_ms = 0;  // the workers' time building and timing those candidates (not in build_ms)
};
CudnnFusionStats cudnn_fusion_stats();

// Waits until no plan is being built in the background (see cudnn_conv_bias_act); for tests and
// benchmarks that want every configuration's plan in place.
void cudnn_fusion_wait_background();

// Forgets the plans held in memory (the next use of a configuration reads the disk cache or builds
// again), as a new process would; for tests.
void cudnn_fusion_forget_plans();

}  // namespace libreyolo::models
