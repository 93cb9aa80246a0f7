#include "layers/conv_bn_act.hpp"

#include "core/env.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

#include "layers/cudnn_fusion.hpp"
#include "layers/stem_conv.hpp"
#include "layers/conv_detail.hpp"
#include "layers/sync_bn.hpp"
#include "layers/weight_grads.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/bias_act.hpp"
#include "kernels/bn_act.hpp"
#include "layers/kernel_dtype.hpp"
#endif

namespace libreyolo::models {
using detail::as_rows;
using detail::rows_as_nchw;
using detail::direct_cudnn;

namespace {


EnvFlag fused_flag{"LIBREYOLO_FUSED_CONV"};

EnvFlag repconvn_flag{"LIBREYOLO_FUSED_REPCONVN"};

EnvFlag addend_flag{"LIBREYOLO_FUSED_ADDEND"};

EnvFlag kernels_flag{"LIBREYOLO_FUSED_CONV_KERNELS"};

// Runs the body below autograd and autocast: the node does its own casts and its own backward.
struct BelowAutograd {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

// The dtype a fused node computes in for input x: autocast's when it is on, else x's own. Ask
// before BelowAutograd: with autocast's keys excluded it reports autocast as off.
at::ScalarType node_compute_dtype(const at::Tensor& x) {
  const auto device_type = x.device().type();
  return at::autocast::is_autocast_enabled(device_type) ? at::autocast::get_autocast_dtype(device_type)
                                                        : x.scalar_type();
}

// A convolution weight in the compute dtype ct: itself, or the model's cast of it for this step
// (BatchedLayerState) when that has ct, else a fresh cast.
at::Tensor weight_in(const at::Tensor& weight, const at::Tensor* step_cast, at::ScalarType ct) {
  if (weight.scalar_type() == ct) return weight;
  return step_cast && step_cast->scalar_type() == ct ? *step_cast : weight.to(ct);
}

#ifdef LIBREYOLO_CUDA_KERNELS
// Per device, kept for the life of the process (never freed: a static tensor would be destroyed
// after the CUDA caching allocator at exit), both allocated once at their largest size, so no
// launch allocates or moves them (a captured step keeps their addresses):
//  - the counters, zeroed once; the kernels leave them zero;
//  - scratch for the partial sums, reused by every launch. The kernels run in stream order, so
//    it is free again once the launch that used it has been queued behind.
// Both assume one training per device at a time, on one stream.
//
// Scratch bound: a launch needs 3*P*C floats (forward) or 2*P*C + 2*C (backward), P the
// row-blocks. bn_act_row_blocks() gives P <= max(1, 1024 / channel_blocks) with at most 32
// channel groups (of up to 8 channels) per block, so P*C <= max(bn_act_max_partials_per_plane(),
// C); use_kernels() admits C <= 32 * max_counters.
constexpr int64_t kMaxChannels = int64_t{32} * kernels::bn_act_max_counters();
constexpr int64_t kScratchFloats = 4 * std::max<int64_t>(kernels::bn_act_max_partials_per_plane(), kMaxChannels);

struct KernelBuffers {
  unsigned* counters;
  float* scratch;
};

KernelBuffers kernel_buffers(const at::Device& device, int64_t scratch_floats) {
  static std::mutex mutex;
  static std::pair<at::Tensor*, at::Tensor*> buffers[64] = {};
  const int index = device.index() < 0 ? 0 : device.index();
  TORCH_CHECK(index < 64, "device index out of range");
  TORCH_CHECK(scratch_floats <= kScratchFloats, "fused BatchNorm kernels: scratch bound exceeded (",
              scratch_floats, " > ", kScratchFloats, ")");
  std::lock_guard<std::mutex> lock(mutex);
  auto& [counters, scratch] = buffers[index];
  if (!counters) {
    const auto opts = at::TensorOptions().device(device);
    counters = new at::Tensor(at::zeros({kernels::bn_act_max_counters()}, opts.dtype(at::kInt)));
    scratch = new at::Tensor(at::empty({kScratchFloats}, opts.dtype(at::kFloat)));
  }
  return {reinterpret_cast<unsigned*>(counters->data_ptr<int>()), scratch->data_ptr<float>()};
}

bool use_kernels(const at::Tensor& z, const ConvBnActParams& p) {
  kernels::DType dt;
  return kernels_flag.load() && z.is_cuda() && kernel_dtype(z.scalar_type(), &dt) &&
         z.is_contiguous(at::MemoryFormat::ChannelsLast) && p.gamma->scalar_type() == at::kFloat &&
         p.beta->scalar_type() == at::kFloat && p.running_mean->scalar_type() == at::kFloat &&
         p.running_var->scalar_type() == at::kFloat && p.gamma->is_contiguous() &&
         p.beta->is_contiguous() && p.running_mean->is_contiguous() && p.running_var->is_contiguous() &&
         z.size(1) <= kMaxChannels;
}

// One reductions' grid for every launch, for measurements in the step (bench_bn_act sweeps it one
// shape at a time): LIBREYOLO_BN_BLOCK_CHANNELS = channels per block (a power of two, 1..256) and
// LIBREYOLO_BN_ROWS_PER_THREAD = rows per thread (1..64); unset or out of range: the grid chosen by
// the activation's size (kernels::bn_act_reduce_grid_for). LIBREYOLO_BN_VEC=8: 8 channels per thread
// where the channel count and the launch allow (the default is kernels::bn_act_vector_width's 4).
struct ReduceGridChoice {
  int block_channels = 0, rows_per_thread = 0;
  int vec = 0;  // LIBREYOLO_BN_VEC (4 or 8); 0: the default
};

const ReduceGridChoice& reduce_grid_choice() {
  static const ReduceGridChoice choice = [] {
    ReduceGridChoice c;
    c.block_channels = env_int("LIBREYOLO_BN_BLOCK_CHANNELS", 1, 256, 0);
    if ((c.block_channels & (c.block_channels - 1)) != 0) c.block_channels = 0;
    c.rows_per_thread = env_int("LIBREYOLO_BN_ROWS_PER_THREAD", 1, 64, 0);
    c.vec = env_int("LIBREYOLO_BN_VEC", 4, 8, 0);
    if (c.vec != 4 && c.vec != 8) c.vec = 0;
    return c;
  }();
  return choice;
}

// `tensors`: every activation the launch reads or writes; vector accesses only when all of them
// are aligned for it.
// `dy_ld`: the backward's dy row stride (0 or the channel count: packed).
// `max_vec`: the widest vector the kernels to be launched take (the dual ones: 4).
kernels::BnActLaunch launch_for(const at::Tensor& z, bool act, std::initializer_list<const at::Tensor*> tensors,
                                int64_t dy_ld = 0, int max_vec = kernels::bn_act_max_vector_width()) {
  kernels::BnActLaunch l;
  l.channels = static_cast<int>(z.size(1));
  l.rows = z.numel() / z.size(1);
  l.vec = kernels::bn_act_vector_width(l.channels);
  const ReduceGridChoice& fixed = reduce_grid_choice();
  if (fixed.vec == 8 && max_vec >= 8 && l.channels % 8 == 0) l.vec = 8;
  const auto bytes = static_cast<uintptr_t>(l.vec) * z.element_size();
  for (const at::Tensor* t : tensors)
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data_ptr()) % bytes != 0) l.vec = 1;
  l.dy_ld = dy_ld;
  if (dy_ld % l.vec != 0) l.vec = 1;
  // The grid for this activation's size (kernels/bn_act.hpp), unless the environment fixes one.
  kernels::BnActGrid grid = kernels::bn_act_reduce_grid_for(l.rows, l.channels, l.vec);
  if (fixed.block_channels > 0) grid.block_groups = std::max(1, fixed.block_channels / l.vec);  // groups of vec channels
  if (fixed.rows_per_thread > 0) grid.rows_per_thread = fixed.rows_per_thread;
  l.block_groups = grid.block_groups;
  if (kernels::bn_act_counters(l.channels, l.vec, l.block_groups) > kernels::bn_act_max_counters()) l.block_groups = 0;
  l.row_blocks = kernels::bn_act_row_blocks(l.rows, l.channels, l.vec, l.block_groups, grid.rows_per_thread);
  kernel_dtype(z.scalar_type(), &l.dtype);
  l.act = act;
  l.stream = c10::cuda::getCurrentCUDAStream(z.device().index()).stream();
  return l;
}
#endif

}  // namespace

namespace detail {

at::Tensor as_rows(const at::Tensor& t) { return t.permute({0, 2, 3, 1}).reshape({-1, t.size(1)}); }

at::Tensor rows_as_nchw(const at::Tensor& rows, const at::Tensor& like) {
  return rows.view({like.size(0), like.size(2), like.size(3), rows.size(1)}).permute({0, 3, 1, 2});
}

bool direct_cudnn(const at::Tensor& x, const at::Tensor& w, int64_t groups) {
  const auto t = x.scalar_type();
  constexpr int64_t kMax = int64_t{1} << 30;
  return groups == 1 && x.is_cuda() && at::globalContext().userEnabledCuDNN() && w.scalar_type() == t &&
         x.size(0) > 0 && x.numel() / x.size(1) * w.size(0) < kMax &&
         (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) &&
         w.suggest_memory_format() == at::MemoryFormat::ChannelsLast &&
         x.suggest_memory_format() == at::MemoryFormat::ChannelsLast && x.numel() < (int64_t{1} << 30);
}

bool fused_kernels_on() { return kernels_flag.load(); }

}  // namespace detail

int64_t nhwc_row_stride(const at::Tensor& t) {
  if (t.dim() != 4) return 0;
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast)) return t.size(1);
  const int64_t C = t.size(1), H = t.size(2), W = t.size(3), ld = t.stride(3);
  if (W < 2 || t.stride(1) != 1 || ld < C) return 0;
  if (H > 1 && t.stride(2) != W * ld) return 0;
  if (t.size(0) > 1 && t.stride(0) != H * W * ld) return 0;
  return ld;
}

namespace {

#ifdef LIBREYOLO_CUDA_KERNELS
// The backward kernels read dy as NHWC rows: a channel slice of a wider NHWC gradient (what a
// concatenation hands back) where it lies, anything else made packed first. Returns the row stride.
int64_t gradient_rows(at::Tensor& dy) {
  const int64_t ld = nhwc_row_stride(dy);
  if (ld > 0) return ld;
  dy = dy.contiguous(at::MemoryFormat::ChannelsLast);
  return dy.size(1);
}
#endif

// [N, K, H', W'] of conv2d(x, w) (groups 1, dilation 1).
std::vector<int64_t> conv_output_sizes(const at::Tensor& x, const at::Tensor& w, int64_t stride, int64_t padding) {
  return {x.size(0), w.size(0), (x.size(2) + 2 * padding - w.size(2)) / stride + 1,
          (x.size(3) + 2 * padding - w.size(3)) / stride + 1};
}

// Adds g to t.grad, or makes g the gradient when there is none yet.
void accumulate_grad(const at::Tensor& t, const at::Tensor& g) {
  auto& grad = const_cast<at::Tensor&>(t).mutable_grad();
  if (grad.defined()) {
    grad.add_(g);
  } else {
    grad = g;
  }
}

at::Tensor per_channel(const at::Tensor& v) { return v.view({1, -1, 1, 1}); }

// How the forward normalised, and so what it saved for the backward.
constexpr int64_t kPathAten = 0;         // native_batch_norm (+ SiLU)
constexpr int64_t kPathAtenSync = 1;     // SyncBN through ATen's kernels (syncbn::batch_norm)
constexpr int64_t kPathKernels = 2;      // the fused kernels (kernels/bn_act)
constexpr int64_t kPathKernelsSync = 3;  // SyncBN in the fused kernels

// Where the node adds ConvBnActParams::addend (saved_data "addend").
constexpr int64_t kAddendNone = 0;
constexpr int64_t kAddendBeforeAct = 1;
constexpr int64_t kAddendAfterAct = 2;

// The addend as the node computes with it: z's sizes (checked), z's dtype, and on the kernels'
// path z's packed NHWC layout (they read it as [M, C] rows).
at::Tensor addend_for(const at::Tensor& addend, const at::Tensor& z, bool packed_nhwc) {
  TORCH_CHECK(addend.sizes() == z.sizes(), "fused Conv+BN: the addend's sizes ", addend.sizes(),
              " differ from the block output's ", z.sizes());
  at::Tensor a = addend.scalar_type() == z.scalar_type() ? addend : addend.to(z.scalar_type());
  return packed_nhwc ? a.contiguous(at::MemoryFormat::ChannelsLast) : a;
}

// The ATen paths' tail: y = act(bn_out [+ addend]) [+ addend], and the activation's input (what
// SiLU's backward needs; undefined without activation).
std::pair<at::Tensor, at::Tensor> aten_act_addend(const at::Tensor& bn_out, const at::Tensor& add, int64_t mode,
                                                  bool act) {
  const at::Tensor s = mode == kAddendBeforeAct ? bn_out + add : bn_out;
  at::Tensor y = act ? at::silu(s) : s;
  if (mode == kAddendAfterAct) y = y + add;
  return {y, act ? s : at::Tensor()};
}

// A fused node's convolution: geometry and whether it runs as one GEMM over NHWC rows.
struct ConvGeom {
  int64_t stride = 1, padding = 0, groups = 1;
  bool gemm = false;
};

// A grouped convolution the node runs as the equal dense one (block_diagonal): 2-4 groups where
// the training plans take the dense form (the rule of the folded inference blocks,
// fused_dense_groups), so that it runs through a cached cuDNN plan instead of ATen's grouped
// convolution, whose algorithms are autotuned again in every new process, at up to 4x the
// arithmetic of the grouped one.
bool dense_grouped(const at::Tensor& x, int64_t groups) {
  return groups > 1 && fused_dense_groups(x, groups, x.scalar_type(), x.suggest_memory_format()) == groups;
}

// The node's convolution forward (below autograd, operands already in the compute dtype).
at::Tensor conv_forward(const at::Tensor& xc, const at::Tensor& wc, const ConvGeom& g) {
  if (g.gemm) return conv1x1_gemm(xc, wc);
  if (dense_grouped(xc, g.groups)) return conv_forward(xc, block_diagonal(wc, g.groups), {g.stride, g.padding, 1, false});
  if (stem_conv_applies(xc, wc, g.stride, g.padding, g.groups)) return stem_conv_forward(xc, wc, g.stride, g.padding);
  if (direct_cudnn(xc, wc, g.groups)) {
    // A cached cuDNN plan (layers/cudnn_fusion.hpp: chosen once per machine, kept on disk), else
    // what at::convolution would pick, without its dispatch layers and parameter checks.
    const auto fmt = at::MemoryFormat::ChannelsLast;
    const at::Tensor xl = xc.contiguous(fmt), wl = wc.contiguous(fmt);
    at::Tensor z = cudnn_conv_train(TrainConvOp::Forward, xl, wl, conv_output_sizes(xl, wl, g.stride, g.padding),
                                    g.stride, g.padding);
    if (z.defined()) return z;
    auto& ctx = at::globalContext();
    return at::cudnn_convolution(xl, wl, {g.padding, g.padding}, {g.stride, g.stride}, {1, 1}, g.groups,
                                 ctx.benchmarkCuDNN(), ctx.deterministicCuDNN(), ctx.allowTF32CuDNN(at::Float32Op::CONV));
  }
  return at::convolution(xc, wc, {}, {g.stride, g.stride}, {g.padding, g.padding}, {1, 1}, false, {0, 0}, g.groups);
}

// The node's convolution gradients from dz: {dx (need_x), dw (need_w)}. dw is computed on the
// weight-gradient lane's side stream in captured steps (layers/weight_grads.hpp) and, inside a
// DeferredWeightGrads scope, collected for the flush instead of returned (then undefined); `weight`
// is the parameter it belongs to. With `dx_into` (a packed NHWC tensor of x's sizes and dz's dtype)
// dx is added into it and it is returned: by the GEMM itself (beta = 1) where the convolution is one.
std::pair<at::Tensor, at::Tensor> conv_backward(const at::Tensor& dz, const at::Tensor& xc, const at::Tensor& wc,
                                                const at::Tensor& weight, const ConvGeom& g, bool need_x, bool need_w,
                                                const at::Tensor& dx_into = {}) {
  at::Tensor dx, dw;
  if (!need_x && !need_w) return {dx, dw};
  const auto fmt = at::MemoryFormat::ChannelsLast;
  const int64_t stride = g.stride, padding = g.padding;
  // A grouped convolution the forward ran dense: its gradients through the dense weight too, the
  // weight gradient's diagonal blocks taken back.
  const bool dense = dense_grouped(xc, g.groups);
  const at::Tensor wk = dense ? block_diagonal(wc, g.groups) : wc;
  const int64_t groups = dense ? 1 : g.groups;
  // dz as the convolution gradients read it (NHWC, packed) where a plan or the GEMM takes it.
  const at::Tensor dzl = (g.gemm || (groups == 1 && dz.is_cuda())) ? dz.contiguous(fmt) : dz;
  // The weight gradient; with the lane, on its side stream (see layers/weight_grads.hpp).
  const auto weight_grad = [&] {
    if (g.gemm) {
      dw = at::mm(as_rows(dzl).t(), as_rows(xc)).view(wc.sizes());
      return;
    }
    // Cached cuDNN plans where they apply (groups 1, packed channels-last operands), else ATen.
    if (groups == 1 && dz.is_cuda() && xc.is_contiguous(fmt))
      dw = cudnn_conv_train(TrainConvOp::WeightGrad, dzl, xc, wk.sizes(), stride, padding);
    if (!dw.defined()) {
      dw = std::get<1>(at::convolution_backward(dz, xc, wk, c10::nullopt, {stride, stride}, {padding, padding},
                                                {1, 1}, false, {0, 0}, groups, {false, true, false}));
    }
    if (dense) dw = diagonal_blocks(dw, g.groups, wc);
  };
#ifdef LIBREYOLO_CUDA_KERNELS
  const cudaStream_t main = dz.is_cuda() ? c10::cuda::getCurrentCUDAStream(dz.device().index()).stream() : nullptr;
  wgrad::Lane* lane = need_w ? wgrad::lane_for(dz, main) : nullptr;
  const wgrad::Lane::Fork fork = lane ? lane->fork(main) : wgrad::Lane::Fork{};
#endif
  if (need_x) {
    if (g.gemm) {
      const at::Tensor w2 = wc.view({wc.size(0), wc.size(1)});
      if (dx_into.defined() && dx_into.is_contiguous(fmt) && dx_into.scalar_type() == dzl.scalar_type()) {
        as_rows(dx_into).addmm_(as_rows(dzl), w2);  // one GEMM with beta = 1
        dx = dx_into;
      } else {
        dx = rows_as_nchw(at::mm(as_rows(dzl), w2), xc);
      }
    } else {
      if (groups == 1 && dz.is_cuda() && wk.is_contiguous(fmt))
        dx = cudnn_conv_train(TrainConvOp::InputGrad, dzl, wk, xc.sizes(), stride, padding);
      if (!dx.defined()) {
        dx = std::get<0>(at::convolution_backward(dz, xc, wk, c10::nullopt, {stride, stride}, {padding, padding},
                                                  {1, 1}, false, {0, 0}, groups, {true, false, false}));
      }
    }
    if (dx_into.defined() && !dx.is_same(dx_into)) dx = dx_into.add_(dx);
  }
  if (need_w) {
#ifdef LIBREYOLO_CUDA_KERNELS
    if (lane)
      lane->run(fork, main, {dz, dzl, xc, wc, wk}, weight_grad);
    else
#endif
      weight_grad();
  }
  // Inside a DeferredWeightGrads scope the weight gradient is collected and written after
  // backward with multi-tensor ops; otherwise autograd casts it to the weight's dtype and
  // accumulates it.
  if (dw.defined() && wgrad::defer(weight, dw)) dw = at::Tensor();
  return {dx, dw};
}

class ConvBnActFn : public torch::autograd::Function<ConvBnActFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& addend,
                               const ConvBnActParams* p) {
    const at::ScalarType ct = node_compute_dtype(x);
    BelowAutograd below;
    const at::Tensor xc = x.scalar_type() == ct ? x : x.to(ct);
    const at::Tensor wc = weight_in(weight, p->weight_cast, ct);
    const bool gemm = p->pointwise && conv1x1_gemm_applies(xc);
    const at::Tensor z = conv_forward(xc, wc, {p->stride, p->padding, p->groups, gemm});
    TORCH_CHECK(z.numel() / z.size(1) > 1, "Expected more than 1 value per channel when training, got input size ",
                z.sizes());
    auto& saved = ctx->saved_data;
    saved["p"] = c10::IValue(std::vector<int64_t>{p->stride, p->padding, p->groups, gemm ? 1 : 0, p->act ? 1 : 0});
    const int64_t add_mode = !addend.has_value() || !addend->defined() ? kAddendNone
                             : p->addend_after_act                      ? kAddendAfterAct
                                                                        : kAddendBeforeAct;
    saved["addend"] = add_mode;
    at::Tensor y;
    const std::shared_ptr<BnStatsSync> sync = bn_stats_sync();
#ifdef LIBREYOLO_CUDA_KERNELS
    if (use_kernels(z, *p)) {
      c10::cuda::CUDAGuard guard(z.device());
      y = at::empty_like(z);
      const at::Tensor add = add_mode != kAddendNone ? addend_for(*addend, z, true) : at::Tensor();
      auto l = launch_for(z, p->act, {&z, &y, &add});
      l.addend = add.defined() ? add.data_ptr() : nullptr;
      l.addend_after_act = add_mode == kAddendAfterAct;
      const int64_t C = l.channels;
      auto f32 = z.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
      // [mean, invstd] of the batch; under SyncBN [mean, invstd, count] of the global batch.
      at::Tensor stats = at::empty({(sync ? 2 * C + 1 : 2 * C)}, f32);
      const KernelBuffers buf = kernel_buffers(z.device(), 3 * static_cast<int64_t>(l.row_blocks) * l.channels);
      float* mean = stats.data_ptr<float>();
      const auto momentum = static_cast<float>(p->momentum);
      const auto eps = static_cast<float>(p->eps);
      if (sync) {
        // SyncBN in the same kernels: this process's row of a zeroed [world, 2C+1] buffer, the
        // all-reduce sum gathers every row, then one merge and the fused apply.
        const int world = sync->world_size();
        at::Tensor rows = at::zeros({world, 2 * C + 1}, f32);
        kernels::bn_act_local_stats(l, z.data_ptr(), eps, buf.scratch, buf.counters,
                                    rows.data_ptr<float>() + sync->rank() * (2 * C + 1));
        sync->all_reduce_sum(rows);
        kernels::bn_act_forward_merged(l, z.data_ptr(), rows.data_ptr<float>(), world, p->gamma->data_ptr<float>(),
                                       p->beta->data_ptr<float>(), p->running_mean->data_ptr<float>(),
                                       p->running_var->data_ptr<float>(), momentum, eps, mean, y.data_ptr());
        saved["path"] = int64_t{kPathKernelsSync};
      } else {
        kernels::bn_act_forward(l, z.data_ptr(), p->gamma->data_ptr<float>(), p->beta->data_ptr<float>(),
                                p->running_mean->data_ptr<float>(), p->running_var->data_ptr<float>(), momentum,
                                eps, buf.scratch, buf.counters, mean, mean + C, y.data_ptr());
        saved["path"] = int64_t{kPathKernels};
      }
      // An addend before the activation is read again by the backward (SiLU's input).
      ctx->save_for_backward(
          {xc, wc, z, stats, *p->gamma, *p->beta, weight, add_mode == kAddendBeforeAct ? add : at::Tensor()});
      return y;
    }
#endif
    saved["eps"] = p->eps;  // for native_batch_norm_backward
    const at::Tensor add = add_mode != kAddendNone ? addend_for(*addend, z, false) : at::Tensor();
    if (sync) {  // SyncBN: the statistics of the global batch (BnStatsSync)
      syncbn::Result bn =
          syncbn::batch_norm(z, *p->gamma, *p->beta, *p->running_mean, *p->running_var, p->momentum, p->eps, *sync);
      auto [out, act_in] = aten_act_addend(bn.out, add, add_mode, p->act);
      saved["path"] = int64_t{kPathAtenSync};
      ctx->save_for_backward(
          {xc, wc, z, at::stack({bn.mean, bn.invstd}), *p->gamma, *p->beta, weight, act_in, bn.count});
      return out;
    }
    auto bn = at::native_batch_norm(z, *p->gamma, *p->beta, *p->running_mean, *p->running_var, true,
                                    p->momentum, p->eps);
    auto [out, act_in] = aten_act_addend(std::get<0>(bn), add, add_mode, p->act);
    saved["path"] = int64_t{kPathAten};
    // The ATen path keeps SiLU's input for its backward, as the composed ops do.
    ctx->save_for_backward(
        {xc, wc, z, at::stack({std::get<1>(bn), std::get<2>(bn)}), *p->gamma, *p->beta, weight, act_in});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &wc = saved[1], &z = saved[2], &stats = saved[3], &gamma = saved[4],
                     &beta = saved[5];
    const auto p = ctx->saved_data["p"].toIntVector();
    const int64_t stride = p[0], padding = p[1], groups = p[2];
    const bool gemm = p[3] != 0, act = p[4] != 0;
    const int64_t path = ctx->saved_data["path"].toInt();
    const bool need_x = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    const bool need_g = gamma.requires_grad(), need_b = beta.requires_grad();
    const int64_t add_mode = ctx->saved_data["addend"].toInt();
    const bool need_a = add_mode != kAddendNone && ctx->needs_input_grad(2);
    at::Tensor dy = grads[0];
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    BelowAutograd below;
    if (dy.scalar_type() != z.scalar_type()) dy = dy.to(z.scalar_type());
    // The addend's gradient: after the activation, dy itself; before it, the gradient at the sum
    // (the BatchNorm output's), written below by whichever path runs.
    at::Tensor da = need_a && add_mode == kAddendAfterAct ? dy : at::Tensor();
    at::Tensor dz;
    bool done = false;
#ifdef LIBREYOLO_CUDA_KERNELS
    if (path == kPathKernels || path == kPathKernelsSync) {
      const bool synced = path == kPathKernelsSync;
      c10::cuda::CUDAGuard guard(z.device());
      const int64_t dy_ld = gradient_rows(dy);
      dz = (need_x || need_w) ? at::empty_like(z) : at::Tensor();
      const at::Tensor& pre = saved[7];  // the addend before the activation, if any (packed NHWC)
      if (need_a && add_mode == kAddendBeforeAct) da = at::empty_like(z);
      const bool da_here = need_a && add_mode == kAddendBeforeAct;
      auto l = launch_for(z, act, {&z, &dy, &dz, &pre, da_here ? &da : &dz}, dy_ld);
      l.sync_sums = synced;
      l.addend = pre.defined() ? pre.data_ptr() : nullptr;
      l.daddend = da_here ? da.data_ptr() : nullptr;
      auto f32 = z.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous);
      const KernelBuffers buf =
          kernel_buffers(z.device(), 2 * static_cast<int64_t>(l.row_blocks) * l.channels + 2 * l.channels);
      float* partials = buf.scratch;
      const at::Tensor& g_grad = gamma.grad();
      const at::Tensor& b_grad = beta.grad();
      // Both gradients already exist (accumulation over micro-batches): add in the kernel.
      const bool in_place = need_g && need_b && g_grad.defined() && b_grad.defined() &&
                            g_grad.scalar_type() == at::kFloat && b_grad.scalar_type() == at::kFloat &&
                            g_grad.is_contiguous() && b_grad.is_contiguous() && g_grad.device() == z.device() &&
                            b_grad.device() == z.device();
      at::Tensor dg, db;
      if (!in_place && need_g) dg = at::empty({l.channels}, f32);
      if (!in_place && need_b) db = at::empty({l.channels}, f32);
      // Under SyncBN the sums are all-reduced, so they get their own tensor.
      at::Tensor dsum_t = synced ? at::empty({2 * l.channels}, f32) : at::Tensor();
      float* dsum = synced ? dsum_t.data_ptr<float>() : partials + 2 * static_cast<int64_t>(l.row_blocks) * l.channels;
      const float* mean = stats.data_ptr<float>();
      const float* invstd = mean + l.channels;
      // This process's own weight and bias gradients come from its own sums (before any all-reduce).
      kernels::bn_act_backward_reduce(
          l, dy.data_ptr(), z.data_ptr(), gamma.data_ptr<float>(), beta.data_ptr<float>(), mean, invstd, partials,
          buf.counters, dsum, in_place ? g_grad.data_ptr<float>() : (need_g ? dg.data_ptr<float>() : nullptr),
          in_place ? b_grad.data_ptr<float>() : (need_b ? db.data_ptr<float>() : nullptr), in_place);
      if (dz.defined() || da_here) {
        if (synced) {
          const auto sync = bn_stats_sync();
          TORCH_CHECK(sync, "SyncBN: the statistics sync was removed between forward and backward");
          sync->all_reduce_sum(dsum_t);
        }
        kernels::bn_act_backward_elemt(l, dy.data_ptr(), z.data_ptr(), gamma.data_ptr<float>(),
                                       beta.data_ptr<float>(), mean, invstd, dsum,
                                       synced ? mean + 2 * l.channels : nullptr,
                                       dz.defined() ? dz.data_ptr() : nullptr);
      }
      if (!in_place) {
        if (need_g) accumulate_grad(gamma, dg);
        if (need_b) accumulate_grad(beta, db);
      }
      done = true;
    }
#endif
    if (!done && path == kPathAtenSync) {  // forward used synchronised statistics
      const at::Tensor& act_in = saved[7];  // SiLU's input
      const at::Tensor& count = saved[8];
      const at::Tensor mean = stats[0], invstd = stats[1];
      const int64_t C = z.size(1);
      const auto sync = bn_stats_sync();
      if (z.is_cuda()) {
        const at::Tensor dbn = act ? at::silu_backward(dy, act_in) : dy;
        if (need_a && add_mode == kAddendBeforeAct) da = dbn;
        // This process's sums (and from them its own weight and bias gradients) in one kernel.
        auto red = at::batch_norm_backward_reduce(dbn, z, mean, invstd, gamma, need_x || need_w, need_g, need_b);
        if (need_g) accumulate_grad(gamma, std::get<2>(red));
        if (need_b) accumulate_grad(beta, std::get<3>(red));
        if (need_x || need_w) {
          at::Tensor sums = at::cat({std::get<0>(red), std::get<1>(red)});
          if (sync) sync->all_reduce_sum(sums);
          dz = at::batch_norm_backward_elemt(dbn, z, mean, invstd, gamma, sums.narrow(0, 0, C), sums.narrow(0, C, C),
                                             count.to(at::kInt));
        }
      } else {
        const at::Tensor dbn = (act ? at::silu_backward(dy, act_in) : dy).to(at::kFloat);
        if (need_a && add_mode == kAddendBeforeAct) da = dbn;
        const at::Tensor xmu = z.to(at::kFloat) - per_channel(mean);
        at::Tensor sums = at::cat({dbn.sum({0, 2, 3}), (dbn * xmu).sum({0, 2, 3})});
        // This process's own weight and bias gradients, from the sums before the all-reduce.
        if (need_g) accumulate_grad(gamma, sums.narrow(0, C, C) * invstd);
        if (need_b) accumulate_grad(beta, sums.narrow(0, 0, C).clone());
        if (need_x || need_w) {
          if (sync) sync->all_reduce_sum(sums);
          const at::Tensor mean_dy = sums.narrow(0, 0, C) / count, mean_dy_xmu = sums.narrow(0, C, C) / count;
          dz = ((dbn - per_channel(mean_dy) - xmu * per_channel(invstd.square() * mean_dy_xmu)) *
                per_channel(invstd * gamma))
                   .to(z.scalar_type());
        }
      }
      done = true;
    }
    if (!done) {
      const at::Tensor& act_in = saved[7];  // SiLU's input
      const at::Tensor dbn = act ? at::silu_backward(dy, act_in) : dy;
      if (need_a && add_mode == kAddendBeforeAct) da = dbn;
      auto r = at::native_batch_norm_backward(dbn, z, gamma, {}, {}, stats[0], stats[1], true,
                                              ctx->saved_data["eps"].toDouble(),
                                              {need_x || need_w, need_g, need_b});
      dz = std::get<0>(r);
      if (need_g) accumulate_grad(gamma, std::get<1>(r));
      if (need_b) accumulate_grad(beta, std::get<2>(r));
    }
    auto [dx, dw] = conv_backward(dz, xc, wc, saved[6], {stride, padding, groups, gemm}, need_x, need_w);
    return {dx, dw, da, at::Tensor()};
  }
};

#ifdef LIBREYOLO_CUDA_KERNELS
// RepConvN in training as one node (repconvn_train below): silu(bn1(conv1(x)) + bn2(conv2(x))), conv1
// the 3x3 branch, conv2 the 1x1. The two BatchNorms and the sum run in the dual kernels
// (kernels/bn_act.hpp, BnBranch), and conv2's input gradient is added into conv1's by its GEMM.
class RepConvNFn : public torch::autograd::Function<RepConvNFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& w2, const ConvBnActParams* p1, const ConvBnActParams* p2) {
    const at::ScalarType ct = node_compute_dtype(x);
    BelowAutograd below;
    const at::Tensor xc = x.scalar_type() == ct ? x : x.to(ct);
    const at::Tensor wc1 = weight_in(w1, p1->weight_cast, ct), wc2 = weight_in(w2, p2->weight_cast, ct);
    const ConvGeom g1{p1->stride, p1->padding, 1, false};
    const ConvGeom g2{1, 0, 1, conv1x1_gemm_applies(xc)};
    const at::Tensor z1 = conv_forward(xc, wc1, g1), z2 = conv_forward(xc, wc2, g2);
    TORCH_CHECK(z1.sizes() == z2.sizes() && z1.scalar_type() == z2.scalar_type(),
                "RepConvN: the branches' outputs differ: ", z1.sizes(), " and ", z2.sizes());
    TORCH_CHECK(z1.numel() / z1.size(1) > 1, "Expected more than 1 value per channel when training, got input size ",
                z1.sizes());
    TORCH_CHECK(use_kernels(z1, *p1) && use_kernels(z2, *p2), "RepConvN: the fused kernels do not take ", z1.sizes(),
                " (checked by repconvn_train_applicable)");
    c10::cuda::CUDAGuard guard(z1.device());
    at::Tensor y = at::empty_like(z1);
    const auto l = launch_for(z1, true, {&z1, &z2, &y}, 0, 4);
    const int64_t C = l.channels;
    at::Tensor stats = at::empty({4 * C}, z1.options().dtype(at::kFloat).memory_format(at::MemoryFormat::Contiguous));
    float* st = stats.data_ptr<float>();
    const auto b1 = branch(z1, *p1, st), b2 = branch(z2, *p2, st + 2 * C);
    const KernelBuffers buf = kernel_buffers(z1.device(), 3 * static_cast<int64_t>(l.row_blocks) * C);
    kernels::bn_act_dual_forward(l, b1, b2, static_cast<float>(p1->momentum), static_cast<float>(p1->eps),
                                 buf.scratch, buf.counters, y.data_ptr());
    ctx->saved_data["p"] = c10::IValue(std::vector<int64_t>{p1->stride, p1->padding, g2.gemm ? 1 : 0});
    ctx->save_for_backward({xc, wc1, wc2, z1, z2, stats, *p1->gamma, *p1->beta, *p2->gamma, *p2->beta, w1, w2});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &wc1 = saved[1], &wc2 = saved[2], &z1 = saved[3], &z2 = saved[4],
                     &stats = saved[5];
    const at::Tensor &gamma1 = saved[6], &beta1 = saved[7], &gamma2 = saved[8], &beta2 = saved[9];
    const auto p = ctx->saved_data["p"].toIntVector();
    const bool need_x = ctx->needs_input_grad(0), need_w1 = ctx->needs_input_grad(1),
               need_w2 = ctx->needs_input_grad(2);
    at::Tensor dy = grads[0];
    if (!dy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    BelowAutograd below;
    c10::cuda::CUDAGuard guard(z1.device());
    if (dy.scalar_type() != z1.scalar_type()) dy = dy.to(z1.scalar_type());
    const int64_t dy_ld = gradient_rows(dy);
    const at::Tensor dz1 = need_x || need_w1 ? at::empty_like(z1) : at::Tensor();
    const at::Tensor dz2 = need_x || need_w2 ? at::empty_like(z2) : at::Tensor();
    const auto l = launch_for(z1, true, {&z1, &z2, &dy, &dz1, &dz2}, dy_ld, 4);
    const int64_t C = l.channels;
    const KernelBuffers buf = kernel_buffers(z1.device(), 3 * static_cast<int64_t>(l.row_blocks) * C + 3 * C);
    float* dsum = buf.scratch + 3 * static_cast<int64_t>(l.row_blocks) * C;
    float* st = stats.data_ptr<float>();
    const auto b1 = branch(z1, gamma1, beta1, st), b2 = branch(z2, gamma2, beta2, st + 2 * C);
    // BatchNorm's weight and bias gradients: added in the kernel where all four exist (every step
    // after the first), else written to fresh tensors and handed to their .grad.
    const std::array<const at::Tensor*, 4> params{&gamma1, &beta1, &gamma2, &beta2};
    bool in_place = true;
    for (const at::Tensor* t : params) {
      const at::Tensor& g = t->grad();
      in_place = in_place && t->requires_grad() && g.defined() && g.scalar_type() == at::kFloat && g.is_contiguous() &&
                 g.device() == z1.device();
    }
    std::array<at::Tensor, 4> fresh;
    std::array<float*, 4> out{};
    for (size_t i = 0; i < 4; ++i) {
      if (!params[i]->requires_grad()) continue;
      if (in_place) {
        out[i] = params[i]->grad().data_ptr<float>();
      } else {
        fresh[i] = at::empty({C}, stats.options());
        out[i] = fresh[i].data_ptr<float>();
      }
    }
    kernels::bn_act_dual_backward_reduce(l, dy.data_ptr(), b1, b2, buf.scratch, buf.counters, dsum, out[0], out[1],
                                         out[2], out[3], in_place);
    if (dz1.defined() || dz2.defined())
      kernels::bn_act_dual_backward_elemt(l, dy.data_ptr(), b1, b2, dsum, dz1.defined() ? dz1.data_ptr() : nullptr,
                                          dz2.defined() ? dz2.data_ptr() : nullptr);
    if (!in_place)
      for (size_t i = 0; i < 4; ++i)
        if (fresh[i].defined()) accumulate_grad(*params[i], fresh[i]);
    // conv1's gradients, then conv2's with its input gradient added into conv1's.
    auto [dx1, dw1] = conv_backward(dz1, xc, wc1, saved[10], {p[0], p[1], 1, false}, need_x, need_w1);
    auto [dx, dw2] = conv_backward(dz2, xc, wc2, saved[11], {1, 0, 1, p[2] != 0}, need_x, need_w2, dx1);
    return {dx, dw1, dw2, at::Tensor(), at::Tensor()};
  }

 private:
  // One branch as the dual kernels read it; stats: [mean C, invstd C] (written by the forward).
  static kernels::BnBranch branch(const at::Tensor& z, const at::Tensor& gamma, const at::Tensor& beta, float* stats) {
    kernels::BnBranch b;
    b.x = z.data_ptr();
    b.gamma = gamma.data_ptr<float>();
    b.beta = beta.data_ptr<float>();
    b.mean = stats;
    b.invstd = stats + z.size(1);
    return b;
  }
  static kernels::BnBranch branch(const at::Tensor& z, const ConvBnActParams& p, float* stats) {
    kernels::BnBranch b = branch(z, *p.gamma, *p.beta, stats);
    b.running_mean = p.running_mean->data_ptr<float>();
    b.running_var = p.running_var->data_ptr<float>();
    return b;
  }
};
#endif

}  // namespace

bool conv1x1_gemm_applies(const torch::Tensor& x) {
  // Packed NHWC, or a channel slice of it (the GEMM reads rows with a leading dimension).
  return x.is_cuda() && nhwc_row_stride(x) > 0;
}

torch::Tensor conv1x1_gemm(const torch::Tensor& x, const torch::Tensor& weight) {
  return rows_as_nchw(at::mm(as_rows(x), weight.view({weight.size(0), weight.size(1)}).t()), x);
}

torch::Tensor conv1x1_bias_gemm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                int64_t groups) {
  TORCH_CHECK(weight.dim() == 4 && weight.size(2) == 1 && weight.size(3) == 1 && groups >= 1 &&
                  x.dim() == 4 && x.size(1) == weight.size(1) * groups && weight.size(0) % groups == 0,
              "conv1x1_bias_gemm: weight ", weight.sizes(), " with ", groups, " groups does not take input ", x.sizes());
  at::Tensor w = weight.flatten(1);  // [K, C / groups]
  if (groups > 1) w = at::block_diag(w.chunk(groups, 0));
  return rows_as_nchw(at::addmm(bias, as_rows(x), w.t()), x);
}

torch::Tensor block_diagonal(const torch::Tensor& w, int64_t groups) {
  const int64_t k = w.size(0), cg = w.size(1), r = w.size(2), s = w.size(3), kg = k / groups;
  TORCH_CHECK(groups >= 1 && k % groups == 0, "block_diagonal: ", k, " output channels in ", groups, " groups");
  // Built as [K, R, S, C] memory, so the [K, C, R, S] result is channels-last; one copy fills the
  // diagonal blocks: d[g, k', r, s, g, c'] = w[g * kg + k', c', r, s].
  at::Tensor d = at::zeros({k, r, s, cg * groups}, w.options().memory_format(at::MemoryFormat::Contiguous));
  d.view({groups, kg, r, s, groups, cg}).diagonal(0, 0, 4).copy_(w.unflatten(0, {groups, kg}).permute({1, 3, 4, 2, 0}));
  return d.permute({0, 3, 1, 2});
}

torch::Tensor diagonal_blocks(const torch::Tensor& dense, int64_t groups, const torch::Tensor& like) {
  const int64_t k = dense.size(0), c = dense.size(1), kg = k / groups, cg = c / groups;
  TORCH_CHECK(groups >= 1 && k % groups == 0 && c % groups == 0 && like.size(0) == k && like.size(1) == cg,
              "diagonal_blocks: ", dense.sizes(), " in ", groups, " groups is not the dense form of ", like.sizes());
  // [g, kg, R, S, g, cg] -> its diagonal over the two group dimensions: [kg, R, S, cg, g].
  const at::Tensor diag =
      dense.permute({0, 2, 3, 1}).unflatten(0, {groups, kg}).unflatten(4, {groups, cg}).diagonal(0, 0, 4);
  at::Tensor out = at::empty_like(like, like.suggest_memory_format());
  out.unflatten(0, {groups, kg}).permute({1, 3, 4, 2, 0}).copy_(diag);
  return out;
}

void set_fused_conv_training(bool on) { fused_flag.store(on); }
bool fused_conv_training() { return fused_flag.load(); }

void set_fused_conv_kernels(bool on) { kernels_flag.store(on); }

void set_fused_addend(bool on) { addend_flag.store(on); }
bool fused_addend() { return addend_flag.load(); }


bool fused_conv_cuda_kernels() {
#ifdef LIBREYOLO_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool conv_bn_act_applicable(const torch::Tensor& x, const ConvBnActParams& p) {
  if (!fused_conv_training() || !torch::GradMode::is_enabled()) return false;
  if (!x.requires_grad() && !p.weight->requires_grad()) return false;  // no node would be recorded
  return x.dim() == 4;
}

bool repconvn_train_applicable(const torch::Tensor& x, const ConvBnActParams& p1, const ConvBnActParams& p2) {
#ifdef LIBREYOLO_CUDA_KERNELS
  if (!repconvn_flag.load() || !kernels_flag.load() || !conv_bn_act_applicable(x, p1)) return false;
  if (!x.is_cuda() || !x.is_contiguous(at::MemoryFormat::ChannelsLast) || bn_stats_sync()) return false;
  if (p1.groups != 1 || !p2.pointwise || p1.act || p2.act || p1.eps != p2.eps || p1.momentum != p2.momentum)
    return false;
  kernels::DType dt;
  if (!kernel_dtype(node_compute_dtype(x), &dt)) return false;
  for (const ConvBnActParams* p : {&p1, &p2}) {
    for (const at::Tensor* t : {p->gamma, p->beta, p->running_mean, p->running_var})
      if (t->scalar_type() != at::kFloat || !t->is_contiguous() || t->device() != x.device()) return false;
    if (p->weight->dim() != 4 || p->weight->size(0) > kMaxChannels) return false;
  }
  return p1.weight->size(0) == p2.weight->size(0);
#else
  (void)x, (void)p1, (void)p2;
  return false;
#endif
}

torch::Tensor repconvn_train(const torch::Tensor& x, const ConvBnActParams& p1, const ConvBnActParams& p2) {
#ifdef LIBREYOLO_CUDA_KERNELS
  return RepConvNFn::apply(x, *p1.weight, *p2.weight, &p1, &p2);
#else
  (void)x, (void)p1, (void)p2;
  TORCH_CHECK(false, "repconvn_train: built without the CUDA kernels");
#endif
}

void set_fused_repconvn(bool on) { repconvn_flag.store(on); }

torch::Tensor conv_bn_act_train(const torch::Tensor& x, const ConvBnActParams& p) {
  return ConvBnActFn::apply(x, *p.weight, p.addend ? std::optional<torch::Tensor>(*p.addend) : std::nullopt, &p);
}

}  // namespace libreyolo::models
