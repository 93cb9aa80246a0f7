// See cudnn_fusion.hpp. One cudnn_frontend graph per configuration (shapes, pixel strides, dtype,
// stride, padding, activation, residual, device): conv_fprop -> add bias -> SWISH_FWD (beta 1:
// x * sigmoid(x)) -> add residual, float32 accumulation and epilogue, one rounding to the output
// dtype; or, for training, one conv_fprop, conv_dgrad or conv_wgrad node. Plans are chosen, cached
// and kept on disk the same way for both.
#include "layers/cudnn_fusion.hpp"

#include "core/background.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "layers/pixel_stride.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <array>
#include <tuple>
#include <vector>

#ifdef LIBREYOLO_CUDNN_FUSION
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cudnn/Handle.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <dlfcn.h>
#include <unistd.h>
// The frontend reaches cuDNN through dlsym on this handle (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING,
// set by CMake): torch's own libcudnn.so.9, already loaded by libtorch_cuda; nothing else is opened.
#include <cudnn_frontend.h>
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace libreyolo::models {

bool cudnn_fusion_enabled() {
#ifdef LIBREYOLO_CUDNN_FUSION
  static const bool on = [] {
    if (!env_switch_on("LIBREYOLO_CUDNN_FUSION")) return false;
    cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    return cudnn_frontend::cudnn_dlhandle != nullptr;
  }();
  return on;
#else
  return false;
#endif
}

bool cudnn_fusion_takes(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ||
         (dtype == at::kFloat && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV));
}

#ifndef LIBREYOLO_CUDNN_FUSION

torch::Tensor cudnn_conv_bias_act(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, int64_t, int64_t,
                                  bool, const torch::Tensor&, const torch::Tensor&) {
  return {};
}
torch::Tensor cudnn_conv_train(TrainConvOp, const torch::Tensor&, const torch::Tensor&, at::IntArrayRef, int64_t,
                               int64_t) {
  return {};
}
CudnnFusionStats cudnn_fusion_stats() { return {}; }
void cudnn_fusion_forget_plans() {}
void cudnn_fusion_wait_background() {}
PlanTuning set_training_plan_tuning(PlanTuning) { return PlanTuning::InCall; }
bool cudnn_training_plans_settled() { return true; }
int64_t cudnn_adopt_timed_plans() { return 0; }

#else

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kX = 1, kW = 2, kB = 3, kY = 4, kR = 5 };

// Everything a plan depends on but the device; pointers are bound at execution.
struct Shapes {
  fe::DataType_t io;
  std::vector<int64_t> x, w, y;  // all channels-last (w: [K, C, R, S] stored K, R, S, C)
  int64_t stride, padding;
  bool act;
  std::array<int64_t, 3> pixel;  // elements from one pixel to the next in x, y, residual (0: none)
  // -1: the fused inference convolution (bias, activation, residual); else a TrainConvOp, one
  // plain convolution node (packed operands, no epilogue), deterministic engines only.
  int op = -1;
  bool operator<(const Shapes& o) const {
    return std::tie(io, x, w, y, stride, padding, act, pixel, op) <
           std::tie(o.io, o.x, o.w, o.y, o.stride, o.padding, o.act, o.pixel, o.op);
  }
};
using Key = std::pair<int, Shapes>;  // device, configuration

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: declined (or pending); its candidate plan is the one executed
  int64_t workspace = 0;
  bool from_disk = false;
  bool pending = false;  // being built in the background: declined until it is replaced
  // Built in the background: the serialized plan, made into a graph on the handle of the thread
  // that executes it (a plan is never executed on a handle another thread goes on using).
  std::vector<uint8_t> handoff;
  bool build_in_call = false;  // the background build could not hand it over: the next call builds it
  // A timed plan handed over for a configuration that runs the heuristics' plan meanwhile
  // (PlanTuning::Background): that plan, still run inside captures until this one is adopted.
  std::shared_ptr<Plan> previous;
};

struct Cache {
  std::mutex mutex;
  std::map<Key, std::shared_ptr<Plan>> plans;
  CudnnFusionStats stats;
  // Training configurations whose candidates a worker is still timing.
  int64_t unsettled = 0;
  // Heuristics' plans replaced by their timed ones: kept, since a CUDA graph captured meanwhile
  // may still launch them (one per configuration at most).
  std::vector<std::shared_ptr<Plan>> retired;
};

std::atomic<bool> tune_in_background{false};

Cache& cache() {
  // Never destroyed: the plans' cuDNN descriptors must not be freed by static destruction, after
  // the CUDA runtime may have gone.
  static Cache& c = *new Cache;
  return c;
}

// Strides of [N, C, H, W] stored channels-last with `pixel` elements from one pixel to the next
// (C for a packed tensor, more for a channel slice of a wider one).
std::vector<int64_t> nhwc_strides(const std::vector<int64_t>& d, int64_t pixel = 0) {
  if (pixel == 0) pixel = d[1];
  return {pixel * d[2] * d[3], 1, d[3] * pixel, pixel};
}


// A training convolution's graph: one conv_fprop, conv_dgrad or conv_wgrad node over packed
// channels-last operands, its output rounded once to the io dtype (what ATen's cuDNN convolution
// computes); engines cuDNN marks non-deterministic are barred, so that a replayed step equals the
// eager one bit for bit.
std::shared_ptr<fe::graph::Graph> training_graph(cudnnHandle_t handle, const Shapes& s) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
      fe::DataType_t::FLOAT);
  const auto operand = [&](const char* name, int64_t uid, const std::vector<int64_t>& dims) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(
        nhwc_strides(dims)));
  };
  const std::vector<int64_t> pad = {s.padding, s.padding}, stride = {s.stride, s.stride}, dilation = {1, 1};
  std::shared_ptr<fe::graph::Tensor_attributes> out;
  if (s.op == static_cast<int>(TrainConvOp::Forward)) {
    out = g->conv_fprop(operand("x", kX, s.x), operand("w", kW, s.w),
                        fe::graph::Conv_fprop_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
    out->set_uid(kY).set_dim(s.y).set_stride(nhwc_strides(s.y));
  } else if (s.op == static_cast<int>(TrainConvOp::InputGrad)) {
    out = g->conv_dgrad(operand("dy", kY, s.y), operand("w", kW, s.w),
                        fe::graph::Conv_dgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
    out->set_uid(kX).set_dim(s.x).set_stride(nhwc_strides(s.x));
  } else {
    out = g->conv_wgrad(operand("dy", kY, s.y), operand("x", kX, s.x),
                        fe::graph::Conv_wgrad_attributes().set_padding(pad).set_stride(stride).set_dilation(dilation));
    out->set_uid(kW).set_dim(s.w).set_stride(nhwc_strides(s.w));
  }
  out->set_output(true).set_data_type(s.io);
  if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good() ||
      !g->create_execution_plans({fe::HeurMode_t::A}).is_good())
    return nullptr;
  g->deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC});
  if (!g->check_support(handle).is_good()) return nullptr;
  return g;
}

// The operation graph with its heuristics' candidate list (mode A), or null when cuDNN has none.
std::shared_ptr<fe::graph::Graph> operation_graph(cudnnHandle_t handle, const Shapes& s) {
  if (s.op >= 0) return training_graph(handle, s);
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(s.io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
      fe::DataType_t::FLOAT);
  auto X = g->tensor(fe::graph::Tensor_attributes().set_name("x").set_uid(kX).set_dim(s.x).set_stride(
      nhwc_strides(s.x, s.pixel[0])));
  auto W = g->tensor(fe::graph::Tensor_attributes().set_name("w").set_uid(kW).set_dim(s.w).set_stride(nhwc_strides(s.w)));
  auto B = g->tensor(fe::graph::Tensor_attributes()
                         .set_name("bias")
                         .set_uid(kB)
                         .set_dim({1, s.y[1], 1, 1})
                         .set_stride({s.y[1], 1, s.y[1], s.y[1]})
                         .set_data_type(fe::DataType_t::FLOAT));
  auto conv = g->conv_fprop(X, W,
                            fe::graph::Conv_fprop_attributes()
                                .set_padding({s.padding, s.padding})
                                .set_stride({s.stride, s.stride})
                                .set_dilation({1, 1}));
  auto Y = g->pointwise(conv, B, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
  if (s.act)
    Y = g->pointwise(Y, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.f));
  // Float32 without an activation: an identity after the bias. For conv + bias alone cuDNN lists
  // only precompiled engines in float32, which write a channel-slice output through a packed copy
  // (a second kernel); with a second pointwise op it lists its runtime-fused ones, which write the
  // slice directly. H200, v9-t's six detection-head convolutions at batch 1: 7-11 us -> 2.4-4.4 us.
  if (!s.act && s.io == fe::DataType_t::FLOAT)
    Y = g->pointwise(Y, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::IDENTITY));
  if (s.pixel[2] > 0) {
    auto R = g->tensor(fe::graph::Tensor_attributes().set_name("residual").set_uid(kR).set_dim(s.y).set_stride(
        nhwc_strides(s.y, s.pixel[2])));
    Y = g->pointwise(Y, R, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
  }
  Y->set_output(true).set_uid(kY).set_dim(s.y).set_stride(nhwc_strides(s.y, s.pixel[1])).set_data_type(s.io);
  if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good() ||
      !g->create_execution_plans({fe::HeurMode_t::A}).is_good() || !g->check_support(handle).is_good())
    return nullptr;
  return g;
}

// Candidates to build and time per configuration while cuDNN autotuning is on (ForwardGraphs'
// first run of a shape to be captured, training and its validation): 4, and 6 for float32 fused
// convolutions; else 1 (the heuristics' first plan that builds); LIBREYOLO_CUDNN_FUSION_CANDIDATES=N
// overrides. H200, v9-t graphed bf16 (one call, timing each candidate in a CUDA graph): batch 1
// 2.09-2.11 ms with 1 candidate, 1.53-1.54 with 4, 1.44-1.64 with 10; batch 32 6.49-6.54 /
// 6.21-6.24 / 6.48-6.58; compilation at the first call of a shape 3-6 s / 11-15 s / 20-21 s (then
// read from disk: under 1 s). Float32 (TF32) at batch 1 (all 10-12 listed plans timed): the
// fastest was the heuristics' fifth or sixth for 16 of v9-t's 62 configurations and a later one
// for 1 (summed fastest times 0.323 ms among 4, 0.305 among 6 or all), for 8% more compilation
// (17.2 -> 18.6 s); bfloat16 gained nothing measurable from 6 (summed 1.533 -> 1.528 ms at
// batches 1 and 32) for 2.3x the compilation (21 -> 52 s).
int64_t candidates(const Shapes& s) {
  int64_t n = !at::globalContext().benchmarkCuDNN() ? 1 : s.op < 0 && s.io == fe::DataType_t::FLOAT ? 6 : 4;
  if (const char* v = env_get("LIBREYOLO_CUDNN_FUSION_CANDIDATES")) n = std::max(1, std::atoi(v));
  return n;
}

// GPU milliseconds per run of plan `index`, or -1 on failure. kRuns runs are captured in one CUDA
// graph and the best of `replays` replays is taken: a small convolution's kernel is shorter than the
// host's launch, so timing runs launched one by one measures the host, not the plan. (A worker
// timing beside a training takes more replays, other work on the GPU only ever slowing one down,
// and captures on its own stream, `own_stream`, which no other thread launches on.)
float time_plan(cudnnHandle_t handle, fe::graph::Graph& g, int64_t index, std::unordered_map<int64_t, void*>& ptrs,
                const at::Tensor& like, int replays = 3, cudaStream_t own_stream = nullptr) {
  constexpr int kRuns = 10;
  int64_t wsz = 0;
  if (!g.get_workspace_size_plan_at_index(index, wsz).is_good()) return -1;
  at::Tensor space = at::empty({std::max<int64_t>(wsz, 1)}, like.options().dtype(at::kByte));
  const auto current = at::cuda::getCurrentCUDAStream(like.device().index());
  if (!g.execute_plan_at_index(handle, ptrs, space.data_ptr(), index).is_good()) return -1;
  current.synchronize();
  const auto side = own_stream != nullptr ? at::cuda::getStreamFromExternal(own_stream, like.device().index())
                                          : at::cuda::getStreamFromPool(false, like.device().index());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = fe::detail::set_stream(handle, side.stream()) == CUDNN_STATUS_SUCCESS &&
            cudaStreamBeginCapture(side.stream(), cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    for (int r = 0; r < kRuns && ok; ++r) ok = g.execute_plan_at_index(handle, ptrs, space.data_ptr(), index).is_good();
    ok = cudaStreamEndCapture(side.stream(), &graph) == cudaSuccess && ok;
  }
  fe::detail::set_stream(handle, current.stream());
  ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, side.stream()) == cudaSuccess;
  float best = -1;
  for (int r = 0; r < replays && ok; ++r) {
    at::cuda::CUDAEvent a(cudaEventDefault), b(cudaEventDefault);
    a.record(side);
    ok = cudaGraphLaunch(exec, side.stream()) == cudaSuccess;
    b.record(side);
    b.synchronize();
    const float t = a.elapsed_time(b) / kRuns;
    if (ok && (best < 0 || t < best)) best = t;
  }
  side.synchronize();
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture or launch above is reported by the -1, not left pending
  return ok ? best : -1;
}

// ---- plans kept on disk: a runtime-compiled plan's serialized form carries its compiled kernel,
// so a later process loads it instead of compiling again (~0.1 s per convolution). One file per
// configuration under $LIBREYOLO_CUDNN_PLAN_CACHE (off: none), else $XDG_CACHE_HOME/libreyolo-cpp/
// cudnn-plans, else ~/.cache/libreyolo-cpp/cudnn-plans. A file is used only when its magic, its key
// (cuDNN and frontend versions, GPU, configuration) and its payload checksum match; anything else
// (a torn write, another version, a corrupt byte) is ignored and the plan built and written again.

constexpr char kMagic[8] = {'L', 'Y', 'C', 'P', 'L', 'A', 'N', '1'};

std::string plan_dir() {
  if (const char* v = env_get("LIBREYOLO_CUDNN_PLAN_CACHE"); v && *v) {
    const std::string d = v;
    return d == "off" || d == "0" ? "" : d;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/libreyolo-cpp/cudnn-plans";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/libreyolo-cpp/cudnn-plans";
  return "";
}

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ULL) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

// The configuration in words, for plan keys and logs.
std::string describe(const Shapes& s) {
  std::ostringstream d;
  d << "io " << static_cast<int>(s.io) << " x";
  for (auto v : s.x) d << ' ' << v;
  d << " w";
  for (auto v : s.w) d << ' ' << v;
  d << " stride " << s.stride << " pad " << s.padding << " act " << s.act << " pixel " << s.pixel[0] << ' '
    << s.pixel[1] << ' ' << s.pixel[2];
  if (s.op >= 0) d << " training op " << s.op;
  return d.str();
}

// Bumped when operation_graph() builds a configuration differently (2: float32's identity op), so
// that plans kept on disk from an older build are not taken for the new graph.
constexpr int kGraphVersion = 2;

std::string plan_key(const Shapes& s, int device, int64_t count) {
  const auto* prop = at::cuda::getDeviceProperties(device);
  std::ostringstream k;
  k << "cudnn " << fe::detail::get_backend_version() << " fe " << CUDNN_FRONTEND_VERSION << " gpu " << prop->name
    << " sm " << prop->major << prop->minor << ' ' << describe(s) << " candidates " << count
    << " graph " << kGraphVersion;
  return k.str();
}

std::string plan_path(const std::string& dir, const std::string& key) {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.plan",
                static_cast<unsigned long long>(fnv1a(reinterpret_cast<const uint8_t*>(key.data()), key.size())));
  return dir + "/" + name;
}

// The payload stored for `key`, or empty.
std::vector<uint8_t> read_plan(const std::string& path, const std::string& key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  char magic[8];
  uint64_t key_len = 0, len = 0, sum = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return {};
  if (!f.read(reinterpret_cast<char*>(&key_len), 8) || key_len != key.size()) return {};
  std::string stored(key_len, '\0');
  if (!f.read(stored.data(), static_cast<std::streamsize>(key_len)) || stored != key) return {};
  if (!f.read(reinterpret_cast<char*>(&len), 8) || !f.read(reinterpret_cast<char*>(&sum), 8)) return {};
  if (len == 0 || len > (64u << 20)) return {};
  std::vector<uint8_t> data(len);
  if (!f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(len))) return {};
  if (fnv1a(data.data(), data.size()) != sum) return {};
  return data;
}

void write_plan(const std::string& dir, const std::string& path, const std::string& key,
                const std::vector<uint8_t>& data) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;
    const uint64_t key_len = key.size(), len = data.size(), sum = fnv1a(data.data(), data.size());
    f.write(kMagic, 8);
    f.write(reinterpret_cast<const char*>(&key_len), 8);
    f.write(key.data(), static_cast<std::streamsize>(key.size()));
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(reinterpret_cast<const char*>(&sum), 8);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    if (!f) {
      f.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, path, ec);  // atomic: readers see the old file or the whole new one
  if (ec) std::filesystem::remove(tmp, ec);
}

// A serialized plan (from disk or from a background build) made into a graph on `handle`, or null.
std::shared_ptr<fe::graph::Graph> plan_from_bytes(cudnnHandle_t handle, const std::vector<uint8_t>& data) {
  if (data.empty()) return nullptr;
  try {
    auto g = std::make_shared<fe::graph::Graph>();
    // No warm-up: the frontend's warm-up captures a throwaway CUDA graph on a new blocking stream
    // when the handle has none, and a capture on a blocking stream invalidates (and fails) whatever
    // another thread queues on the legacy default stream meanwhile. A plan's first execution is
    // always eager here (captures run each shape eagerly first), which loads its kernels.
    if (!g->deserialize(handle, data, /*enforce_precompiled=*/false, /*run_warmup=*/false).is_good()) return nullptr;
    return g;
  } catch (const std::exception&) {  // a payload the JSON reader rejects
    return nullptr;
  }
}

// The plan stored on disk for these shapes, or null.
std::shared_ptr<fe::graph::Graph> load_plan(cudnnHandle_t handle, const std::string& path, const std::string& key) {
  return plan_from_bytes(handle, read_plan(path, key));
}

// Builds the graph and picks a plan; a Plan with no graph when cuDNN declines. Runtime-compiled
// engines compile while they build (~0.1 s each): with several candidates each is built on its own
// thread, in its own copy of the graph with its own cuDNN handle, then timed here one by one.
// `count` candidates (candidates()); with more than one, `time` gives a built candidate's GPU time
// (time_plan on the call's operands). Without `time` (a background build) the first that builds.
using TimePlan = std::function<float(fe::graph::Graph&, int64_t)>;

// The plan kept on disk for these shapes (a Plan marked from_disk), or null.
std::shared_ptr<Plan> stored_plan(cudnnHandle_t handle, const Shapes& s, int device, int64_t count) {
  const std::string dir = plan_dir();
  if (dir.empty()) return nullptr;
  const std::string key = plan_key(s, device, count);
  auto plan = std::make_shared<Plan>();
  auto stored = load_plan(handle, plan_path(dir, key), key);
  if (!stored || !stored->get_workspace_size(plan->workspace).is_good()) return nullptr;
  plan->graph = std::move(stored);
  plan->from_disk = true;
  return plan;
}

std::shared_ptr<Plan> build(cudnnHandle_t handle, const Shapes& s, int device, int64_t count, const TimePlan& time) {
  if (auto stored = stored_plan(handle, s, device, count)) return stored;
  auto plan = std::make_shared<Plan>();
  const std::string dir = plan_dir();
  const std::string key = dir.empty() ? "" : plan_key(s, device, count);
  const std::string path = dir.empty() ? "" : plan_path(dir, key);
  auto g = operation_graph(handle, s);
  if (!g) return plan;
  static std::once_flag said_fused, said_training;
  const auto say = [&] {
    const std::string where = dir.empty() ? std::string("the disk cache is off") : "kept in " + dir;
    log_info(s.op < 0 ? "cuDNN fusion: compiling fused convolution kernels for new shapes (up to ~0.5 s each, once "
                        "per machine: " + where + ")"
                      : "cuDNN: timing training convolution plans for new shapes (once per machine: " + where + ")");
  };
  if (s.op < 0)
    std::call_once(said_fused, say);
  else if (time && count > 1)  // (a training plan built without timing is not news)
    std::call_once(said_training, say);
  const int64_t total = g->get_execution_plan_count();
  if (!time) count = 1;
  count = std::min(total, count);
  std::shared_ptr<fe::graph::Graph> best_graph;
  int64_t best = -1;
  if (count <= 1) {  // the heuristics' first plan that builds
    for (int64_t i = 0; i < total && best < 0; ++i)
      if (g->build_plan_at_index(i).is_good()) best = i;
    best_graph = g;
  } else {
    // The first `count` candidates that build (a barred engine, e.g. a non-deterministic one, or
    // one that fails to build makes room for the next), each in its own copy of the graph. Fused
    // plans compile their kernels while they build: `count` at a time on threads with their own
    // cuDNN handles; a training convolution's engines are precompiled, built here one by one.
    std::vector<std::shared_ptr<fe::graph::Graph>> graphs(total);
    const auto build_one = [&](cudnnHandle_t h, int64_t i) {
      auto gi = i == 0 ? g : operation_graph(h, s);
      if (gi && gi->build_plan_at_index(i).is_good()) graphs[i] = std::move(gi);
    };
    int64_t built = 0;
    for (int64_t start = 0; start < total && built < count; start += count) {
      const int64_t end = std::min(total, start + count);
      if (s.op >= 0) {
        for (int64_t i = start; i < end; ++i) build_one(handle, i);
      } else {
        std::vector<std::thread> threads;
        for (int64_t i = start; i < end; ++i)
          threads.emplace_back([&, i] {
            c10::cuda::set_device(device);
            cudnnHandle_t h = nullptr;
            if (fe::detail::create_handle(&h) != CUDNN_STATUS_SUCCESS) return;
            build_one(h, i);
            fe::detail::destroy_handle(h);
          });
        for (auto& t : threads) t.join();
      }
      for (int64_t i = start; i < end; ++i) built += graphs[i] ? 1 : 0;
    }
    float best_ms = -1;
    std::string timings;  // for the debug log: each candidate's engine and time
    for (int64_t i = 0, timed = 0; i < total && timed < count; ++i) {
      if (!graphs[i]) continue;
      ++timed;
      const float ms = time(*graphs[i], i);
      if (ms >= 0 && (best_ms < 0 || ms < best_ms)) best_ms = ms, best = i, best_graph = graphs[i];
      if (log_level() <= LogLevel::Debug) {
        std::string name;
        if (!graphs[i]->get_plan_name_at_index(i, name).is_good()) name = "?";
        timings += strfmt(" [%lld] %s %.4f ms;", static_cast<long long>(i), name.c_str(), ms);
      }
    }
    if (log_level() <= LogLevel::Debug)
      log_debug(strfmt("cuDNN plans for %s: %lld listed, chose [%lld]:", describe(s).c_str(),
                       static_cast<long long>(total), static_cast<long long>(best)) + timings);
  }
  if (best < 0 || !best_graph->get_workspace_size(plan->workspace).is_good()) return plan;
  if (!dir.empty()) {
    std::vector<uint8_t> data;
    if (best_graph->serialize(data, /*serialize_structure=*/false).is_good()) write_plan(dir, path, key, data);
  }
  plan->graph = std::move(best_graph);
  return plan;
}

// The frontend's name for a dtype cudnn_fusion_takes.
fe::DataType_t fe_dtype(at::ScalarType t) {
  return t == at::kHalf ? fe::DataType_t::HALF : t == at::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::FLOAT;
}

// Output extent of a convolution along one side (dilation 1).
int64_t out_side(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// ---- background builds. A fused inference convolution met without autotuning (eager predict and
// val outside training), whose plan is neither in memory nor on disk, is declined for now (the
// caller runs ATen's convolution and its own epilogue) while worker threads, each with its own cuDNN
// handle, build the plan (the heuristics' first that builds, what the calling thread would have
// built) and keep it on disk; later calls of the configuration run it, later processes read it. A
// first predict on a machine so does not wait for kernels to compile (~0.1-0.5 s each, a few dozen
// per network). The default (LIBREYOLO_CUDNN_PLAN_BUILD=background; =wait: the calling thread
// builds, as it always does for autotuned configurations (captures, training and its validation)
// and training convolutions). A worker shares nothing with the callers' streams or
// handles: its handle runs on a non-blocking stream of its own, it reads plans from disk without
// the frontend's warm-up capture, and it hands each plan over serialized, to be made into a graph
// on the handle of the thread that executes it. (A worker's warm-up capture on a blocking stream,
// when the plan it was to build had meanwhile been written to disk by another process, would fail
// the caller's work on the legacy default stream: four trainings sharing one plan folder crashed
// once so; GpuCudnnFusion.BackgroundBuildsAndDiskLoadsBesideDefaultStreamWorkArriveAndAgree.)
bool background_builds() {
  const char* v = env_get("LIBREYOLO_CUDNN_PLAN_BUILD");
  if (!v || !*v) return true;
  const std::string mode = v;
  if (mode == "wait") return false;
  if (mode == "background") return true;
  static std::once_flag said;
  std::call_once(said, [&] {
    log_warn("LIBREYOLO_CUDNN_PLAN_BUILD='" + mode + "' is neither 'background' nor 'wait': plans are built by the call");
  });
  return false;
}

// A training configuration's timing ended (its plan handed over, or none): one fewer to wait for.
// Under the cache's mutex.
void settle_one(Cache& c) { c.unsettled = std::max<int64_t>(0, c.unsettled - 1); }

// The x, w and y of a training configuration, allocated on the current stream, with their
// pointers by uid: a worker times candidates on operands of its own, not on a caller's.
struct OwnOperands {
  at::Tensor x, w, y;
  std::unordered_map<int64_t, void*> ptrs;
  OwnOperands(const Shapes& s, int device) {
    const auto dtype = s.io == fe::DataType_t::HALF       ? at::kHalf
                       : s.io == fe::DataType_t::BFLOAT16 ? at::kBFloat16
                                                          : at::kFloat;
    const auto o = at::TensorOptions().dtype(dtype).device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)))
                       .memory_format(at::MemoryFormat::ChannelsLast);
    x = at::zeros(s.x, o);
    w = at::zeros(s.w, o);
    y = at::zeros(s.y, o);
    ptrs = {{kX, x.data_ptr()}, {kW, w.data_ptr()}, {kY, y.data_ptr()}};
  }
};

class Builder {
 public:
  static Builder& get() {
    static Builder b;
    return b;
  }
  // count 1: build the heuristics' first plan for a pending configuration (declined meanwhile);
  // more: time `count` candidates of a training configuration that runs `plan`, the heuristics'
  // plan, meanwhile (PlanTuning::Background).
  void submit(const Key& key, std::shared_ptr<Plan> plan, int64_t count = 1) {
    std::lock_guard<std::mutex> lock(m_);
    if (threads_.empty()) {
      const unsigned n = std::clamp(std::thread::hardware_concurrency() / 4, 1u, 4u);
      for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
    }
    queue_.push_back({key, std::move(plan), count});
    ++outstanding_;
    work_cv_.notify_one();
  }
  int64_t outstanding() {
    std::lock_guard<std::mutex> lock(m_);
    return outstanding_;
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(m_);
    idle_cv_.wait(lock, [&] { return outstanding_ == 0; });
  }
  // The builds in progress finish (each well under a second), the queued ones are dropped and
  // forgotten (their convolutions submit them again when next met), the workers end; a later
  // submit starts new ones. See core/background.hpp for why this runs before the process exits.
  void stop() {
    std::deque<Job> dropped;
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
      outstanding_ -= static_cast<int64_t>(queue_.size());
      dropped.swap(queue_);
      threads.swap(threads_);
    }
    work_cv_.notify_all();
    for (auto& t : threads) t.join();
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = false;
      if (outstanding_ == 0) idle_cv_.notify_all();
    }
    if (dropped.empty()) return;
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (const Job& job : dropped) {
      if (job.count > 1) {  // a timing dropped: the heuristics' plan stays
        settle_one(c);
        continue;
      }
      if (auto it = c.plans.find(job.key); it != c.plans.end() && it->second == job.plan) c.plans.erase(it);
    }
  }
  ~Builder() {
    alive_ = false;
    stop();
  }

 private:
  Builder() {
    on_background_stop([] {
      if (alive_) get().stop();
    });
  }
  static inline std::atomic<bool> alive_{true};
  // A worker's cuDNN handle on a device, bound to a non-blocking stream of its own (nothing a
  // worker does may wait on, or be waited on by, the legacy default stream the callers run on).
  struct Own {
    cudnnHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
  };
  static Own make_own() {
    Own o;
    if (fe::detail::create_handle(&o.handle) != CUDNN_STATUS_SUCCESS) return {};
    if (cudaStreamCreateWithFlags(&o.stream, cudaStreamNonBlocking) != cudaSuccess ||
        fe::detail::set_stream(o.handle, o.stream) != CUDNN_STATUS_SUCCESS) {
      cudaGetLastError();
      if (o.stream != nullptr) cudaStreamDestroy(o.stream);
      fe::detail::destroy_handle(o.handle);
      return {};
    }
    return o;
  }
  // The built plan as the calling thread will take it: serialized, to be made into a graph on the
  // executing thread's own handle (cuDNN's thread safety covers threads on separate handles; a plan
  // finalized on this worker's handle is not executed elsewhere while this worker goes on using it).
  static std::shared_ptr<Plan> hand_over(const Plan& built) {
    auto out = std::make_shared<Plan>();
    if (!built.graph) return out;  // declined
    out->workspace = built.workspace;
    out->from_disk = built.from_disk;
    if (!built.graph->serialize(out->handoff, /*serialize_structure=*/false).is_good() || out->handoff.empty()) {
      out->handoff.clear();
      out->build_in_call = true;
    }
    return out;
  }
  void work() {
    std::map<int, Own> own;  // this thread's, per device
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(m_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;  // stopping
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      const auto& [device, shapes] = job.key;
      const bool timing = job.count > 1;
      std::shared_ptr<Plan> built;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
        auto [slot, added] = own.try_emplace(device);
        if (added) slot->second = make_own();
        const Own& o = slot->second;
        if (o.handle != nullptr && !timing) {
          if (auto b = build(o.handle, shapes, device, 1, {})) built = hand_over(*b);
        } else if (o.handle != nullptr) {
          // The candidates run on this worker's stream, on operands allocated there.
          c10::cuda::CUDAStreamGuard on_own(
              at::cuda::getStreamFromExternal(o.stream, static_cast<c10::DeviceIndex>(device)));
          OwnOperands operands(shapes, device);
          const TimePlan time = [&](fe::graph::Graph& g, int64_t i) {
            // One worker times at a time (building goes on in parallel): they would slow each other.
            static std::mutex timing;
            std::lock_guard<std::mutex> one(timing);
            return time_plan(o.handle, g, i, operands.ptrs, operands.x, /*replays=*/5, o.stream);
          };
          if (auto b = build(o.handle, shapes, device, job.count, time); b && b->graph) built = hand_over(*b);
          cudaStreamSynchronize(o.stream);  // the operands are freed after their last use
        }
      } catch (const std::exception& e) {
        log_debug(std::string("cuDNN fusion: a background build failed: ") + e.what());
      }
      if (!built && !timing) built = std::make_shared<Plan>();  // declined
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      {
        Cache& c = cache();
        std::lock_guard<std::mutex> lock(c.mutex);
        // Replaced meanwhile (a foreground build, forget_plans): the newer entry stays.
        auto it = c.plans.find(job.key);
        const bool current = it != c.plans.end() && it->second == job.plan;
        if (timing) {
          c.stats.timing_ms += ms;
          settle_one(c);
          if (current && built && !built->handoff.empty()) {
            built->previous = job.plan;  // run inside captures until adopted
            it->second = built;
          }  // else no timed plan (none built, or the entry replaced): the heuristics' plan stays
        } else if (current) {
          it->second = built;
          c.stats.build_ms += ms;
          if (!built->build_in_call) ++(built->handoff.empty() ? c.stats.declined : c.stats.fused);
          if (built->from_disk) ++c.stats.loaded;
        }
      }
      std::lock_guard<std::mutex> lock(m_);
      if (--outstanding_ == 0) idle_cv_.notify_all();
    }
    for (auto& [device, o] : own) {
      if (o.handle != nullptr) fe::detail::destroy_handle(o.handle);
      if (o.stream != nullptr) cudaStreamDestroy(o.stream);
    }
  }

  struct Job {
    Key key;
    std::shared_ptr<Plan> plan;  // the pending entry (count 1) or the heuristics' plan being run
    int64_t count = 1;
  };
  std::mutex m_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Job> queue_;
  std::vector<std::thread> threads_;
  int64_t outstanding_ = 0;
  bool stop_ = false;
};

// A plan handed over by a worker, made into a graph on `handle` (the calling thread's; no graph
// when that fails).
std::shared_ptr<Plan> made_here(cudnnHandle_t handle, const Plan& handed) {
  auto out = std::make_shared<Plan>();
  out->graph = plan_from_bytes(handle, handed.handoff);
  out->workspace = handed.workspace;
  out->from_disk = handed.from_disk;
  return out;
}

// A timed plan (`adopted`, made into a graph on this thread's handle, or null when that failed)
// takes the place of the heuristics' plan `entry` ran meanwhile. Under the cache's mutex.
void adopt_timed(Cache& c, std::shared_ptr<Plan>& entry, std::shared_ptr<Plan> adopted) {
  std::shared_ptr<Plan> previous = std::move(entry->previous);
  if (!adopted->graph) {
    entry = std::move(previous);
    return;
  }
  ++c.stats.adopted;
  c.retired.push_back(std::move(previous));
  entry = std::move(adopted);
}

// The cached plan for `shapes` (built on its first use, on this thread or in the background, never
// inside a capture) run on `ptrs`; false when cuDNN has no engine for it, its plan is still being
// built, or the launch failed (then nothing was written).
bool run_plan(const Shapes& shapes, std::unordered_map<int64_t, void*>& ptrs, const at::Tensor& like) {
  const int device = like.device().index();
  const Key key{device, shapes};
  const auto stream = at::cuda::getCurrentCUDAStream(device).stream();
  cudnnHandle_t handle = at::native::getCudnnHandle();
  if (fe::detail::set_stream(handle, stream) != CUDNN_STATUS_SUCCESS) return false;
  std::shared_ptr<Plan> plan;
  {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.plans.find(key);
    const bool known = it != c.plans.end();
    if (!known || it->second->pending || !it->second->handoff.empty() || it->second->build_in_call) {
      // Not ready to run: pending, handed over by a background build, or to be built.
      // Building times candidates (synchronising) and may compile kernels: never inside a capture.
      // Captures run each shape eagerly first (ForwardGraphs, the training step's first
      // occurrences), so this only declines strays.
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
        if (!known || !it->second->previous) return false;
        plan = it->second->previous;  // a timed plan not adopted yet: the heuristics' one meanwhile
      } else if (known && !it->second->handoff.empty()) {
        // Built in the background: made into a graph on this thread's handle (no kernel compiles).
        auto adopted = made_here(handle, *it->second);
        if (it->second->previous) {  // a timed plan replacing the heuristics' one
          adopt_timed(c, it->second, std::move(adopted));
        } else {
          if (!adopted->graph) --c.stats.fused, ++c.stats.declined;
          it->second = std::move(adopted);
        }
      } else {
        const int64_t count = candidates(shapes);
        const bool background = shapes.op < 0 && count == 1 && background_builds() && !(known && it->second->build_in_call);
        if (background && known) return false;  // pending: not ready yet
        // A training configuration while autotuning, in a single-process training: the
        // heuristics' first plan now, its candidates timed on a worker (set_training_plan_tuning).
        const bool tune_later = shapes.op >= 0 && count > 1 && tune_in_background.load() && background_builds();
        const auto t0 = std::chrono::steady_clock::now();
        std::shared_ptr<Plan> built;
        if (tune_later) {
          built = stored_plan(handle, shapes, device, count);
          if (!built) {
            built = build(handle, shapes, device, 1, {});
            if (built->graph) {
              static std::once_flag said;
              std::call_once(said, [] {
                log_info("cuDNN: new training convolution shapes run the heuristics' plans while a worker times "
                         "their candidates (once per machine); the step is captured once they are in place");
              });
              ++c.stats.provisional;
              ++c.unsettled;
              Builder::get().submit(key, built, count);
            }
          }
        } else if (background) {
          built = stored_plan(handle, shapes, device, count);
          if (!built) {
            static std::once_flag said;
            std::call_once(said, [] {
              log_info("cuDNN fusion: building fused convolution plans in the background (once per machine); "
                       "until each is ready its convolution runs unfused");
            });
            auto pending = std::make_shared<Plan>();
            pending->pending = true;
            c.plans.emplace(key, pending);
            Builder::get().submit(key, pending);
            return false;
          }
        } else {
          // Autotuned, or waited for: built here (replacing a pending background build of it).
          const TimePlan time = [&](fe::graph::Graph& g, int64_t i) { return time_plan(handle, g, i, ptrs, like); };
          built = build(handle, shapes, device, count, time);
        }
        c.stats.build_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ++(built->graph ? c.stats.fused : c.stats.declined);
        if (built->from_disk) ++c.stats.loaded;
        if (it == c.plans.end())
          it = c.plans.emplace(key, std::move(built)).first;
        else
          it->second = std::move(built);
      }
    }
    if (!plan) plan = it->second;
  }
  if (!plan->graph) return false;
  at::Tensor space = at::empty({std::max<int64_t>(plan->workspace, 1)}, like.options().dtype(at::kByte));
  return plan->graph->execute(handle, ptrs, space.data_ptr()).is_good();
}

}  // namespace

CudnnFusionStats cudnn_fusion_stats() {
  CudnnFusionStats st;
  {
    std::lock_guard<std::mutex> lock(cache().mutex);
    st = cache().stats;
  }
  st.pending = Builder::get().outstanding();
  return st;
}

void cudnn_fusion_wait_background() { Builder::get().wait_idle(); }

PlanTuning set_training_plan_tuning(PlanTuning tuning) {
  return tune_in_background.exchange(tuning == PlanTuning::Background) ? PlanTuning::Background : PlanTuning::InCall;
}

bool cudnn_training_plans_settled() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().unsettled == 0;
}

int64_t cudnn_adopt_timed_plans() {
  const int device = c10::cuda::current_device();
  int64_t n = 0;
  cudnnHandle_t handle = at::native::getCudnnHandle();
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [key, plan] : c.plans) {
    if (key.first != device || !plan->previous || plan->handoff.empty()) continue;
    adopt_timed(c, plan, made_here(handle, *plan));
    ++n;
  }
  return n;
}

void cudnn_fusion_forget_plans() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().plans.clear();
}

torch::Tensor cudnn_conv_bias_act(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias32,
                                  int64_t stride, int64_t padding, bool act, const torch::Tensor& residual,
                                  const torch::Tensor& out) {
  if (!cudnn_fusion_enabled() || !x.is_cuda() || x.dim() != 4 || w.dim() != 4) return {};
  const auto io = x.scalar_type();
  if (!cudnn_fusion_takes(io) || w.scalar_type() != io || bias32.scalar_type() != at::kFloat ||
      !bias32.is_contiguous() || bias32.numel() != w.size(0) || w.size(1) != x.size(1))  // groups 1 only
    return {};
  const int64_t oh = out_side(x.size(2), w.size(2), stride, padding);
  const int64_t ow = out_side(x.size(3), w.size(3), stride, padding);
  if (oh <= 0 || ow <= 0 || x.size(0) == 0) return {};
  const std::vector<int64_t> ysize = {x.size(0), w.size(0), oh, ow};
  for (const at::Tensor* t : {&residual, &out})
    if (t->defined() && (t->sizes() != at::IntArrayRef(ysize) || t->scalar_type() != io || t->device() != x.device()))
      return {};
  // Every operand 16-byte aligned, and in a channel slice each pixel's channels too (plans are
  // built for aligned vector loads and stores).
  const auto aligned = [&](const at::Tensor& t, int64_t pixel) {  // pixel 0: a plain vector
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
           (pixel == 0 || pixel == t.size(1) || (pixel * t.element_size()) % 16 == 0);
  };
  const int64_t xp = common::pixel_stride(x);
  const int64_t rp = residual.defined() ? common::pixel_stride(residual) : 0;
  if (xp == 0 || !aligned(x, xp) || !aligned(bias32, 0) || (residual.defined() && (rp == 0 || !aligned(residual, rp))))
    return {};
  const at::Tensor wc = w.is_contiguous(at::MemoryFormat::ChannelsLast) ? w : w.contiguous(at::MemoryFormat::ChannelsLast);
  if (!aligned(wc, wc.size(1))) return {};
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = out.defined() ? out : at::empty(ysize, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const int64_t yp = common::pixel_stride(y);
  if (yp == 0 || !aligned(y, yp)) return {};
  const Shapes shapes{fe_dtype(io), x.sizes().vec(), wc.sizes().vec(), ysize, stride, padding, act, {xp, yp, rp}};
  std::unordered_map<int64_t, void*> ptrs = {
      {kX, x.data_ptr()}, {kW, wc.data_ptr()}, {kB, bias32.data_ptr()}, {kY, y.data_ptr()}};
  if (residual.defined()) ptrs[kR] = residual.data_ptr();
  // A failed launch leaves y unwritten: decline, the caller computes it its own way.
  return run_plan(shapes, ptrs, x) ? y : at::Tensor();
}

torch::Tensor cudnn_conv_train(TrainConvOp op, const torch::Tensor& a, const torch::Tensor& b, at::IntArrayRef out_sizes,
                               int64_t stride, int64_t padding) {
  static const bool on = env_switch_on("LIBREYOLO_CUDNN_TRAIN_CONV");
  if (!on || !cudnn_fusion_enabled() || !a.is_cuda() || a.dim() != 4 || b.dim() != 4 || out_sizes.size() != 4 ||
      b.device() != a.device())
    return {};
  const auto io = a.scalar_type();
  const auto cl = at::MemoryFormat::ChannelsLast;
  if (!cudnn_fusion_takes(io) || b.scalar_type() != io || !a.is_contiguous(cl) || !b.is_contiguous(cl)) return {};
  // x, w and y of the convolution, whichever two are given.
  const bool fwd = op == TrainConvOp::Forward, dgrad = op == TrainConvOp::InputGrad;
  const std::vector<int64_t> out(out_sizes.begin(), out_sizes.end());
  const std::vector<int64_t> x = fwd ? a.sizes().vec() : dgrad ? out : b.sizes().vec();
  const std::vector<int64_t> w = fwd ? b.sizes().vec() : dgrad ? b.sizes().vec() : out;
  const std::vector<int64_t> y = fwd ? out : a.sizes().vec();
  if (x[0] == 0 || w[1] != x[1] || y[0] != x[0] || y[1] != w[0] ||  // groups 1 only
      y[2] != out_side(x[2], w[2], stride, padding) || y[3] != out_side(x[3], w[3], stride, padding) ||
      y[2] <= 0 || y[3] <= 0)
    return {};
  // Plans are built for 16-byte-aligned vector accesses.
  if (reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 != 0)
    return {};
  c10::cuda::CUDAGuard guard(a.device());
  at::Tensor result = at::empty(out, a.options().memory_format(cl));
  Shapes shapes{fe_dtype(io), x, w, y, stride, padding, false, {x[1], y[1], 0}};
  shapes.op = static_cast<int>(op);
  std::unordered_map<int64_t, void*> ptrs;
  ptrs[kX] = fwd ? a.data_ptr() : dgrad ? result.data_ptr() : b.data_ptr();
  ptrs[kW] = fwd || dgrad ? b.data_ptr() : result.data_ptr();
  ptrs[kY] = fwd ? result.data_ptr() : a.data_ptr();
  return run_plan(shapes, ptrs, a) ? result : at::Tensor();
}

#endif

}  // namespace libreyolo::models
