// Training-step benchmark: one real-looking batch replayed (no data loader), as the reference's
// (LibreYOLO 1.6.0's) step figures were taken: forward + loss + backward + SGD step, 640 px.
//   bench_train_step --device cuda [--family yolo9|yolox|...|resnet] --sizes t,s --batches 8,16,32 --dtypes bf16,fp16,fp32
//                    [--steps 24] [--warmup 6] [--imgsz N] [--nc N] [--memory-format auto|channels_last|contiguous]
//                    [--ema] [--no-kernels] [--fused on|off|both] [--cudnn-benchmark] [--diagnose]
//                    [--cuda-graph off|on|off,on] [--graph-scope auto|step|network|head]
//   --cuda-graph: the whole step replayed from CUDA graphs (StepRunner::enable_cuda_graphs), each
//   configuration measured once per listed mode, in that order.
//   --graph-scope: what is captured: auto (default) is the deepest the family declares (the whole
//   step with capture_train_step, else its network, else its head, with the update); step, network
//   or head ask for that scope whatever the family declares, to measure a capture before the
//   family turns it on.
//   --fused: the fused Conv+BN+SiLU training node (layers/conv_bn_act.hpp), default on.
//   --imgsz: default the family's input size for the size (640 where it has none).
//   --nc: the class count (default 80 for detectors, 5 for classifiers). A classifier (a family of
//   the classify task) trains on class ids with its cross-entropy, a detector on boxes.
// Prints one JSON object: per configuration min/median step ms, img/s, kernels per step, peak memory
// (of the timed window, and reserved memory over the whole configuration: with graphs, their pool).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <map>
#include <sstream>

#ifdef LIBREYOLO_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include "bench_util.hpp"
#include "engine/step.hpp"
#include "core/config_schema.hpp"
#include "core/crash_report.hpp"
#include "core/device.hpp"
#include "layers/conv_bn_act.hpp"
#include "models/detector.hpp"

using namespace libreyolo;
using json = nlohmann::json;

namespace {

using bench::split;

// A batch that looks like training data: mosaic-like random images and 2-20 boxes per image.
std::pair<torch::Tensor, torch::Tensor> make_batch(int64_t b, int64_t s, int nc) {
  torch::manual_seed(0);
  auto images = torch::randint(0, 256, {b, s, s, 3}, torch::kUInt8);
  auto targets = torch::zeros({b, 100, 5});
  targets.select(2, 0).fill_(-1);
  for (int64_t i = 0; i < b; ++i) {
    int64_t n = 2 + (i * 7) % 19;
    for (int64_t k = 0; k < n; ++k) {
      float cx = 0.1f + 0.8f * torch::rand({1}).item<float>(), cy = 0.1f + 0.8f * torch::rand({1}).item<float>();
      float w = 0.02f + 0.3f * torch::rand({1}).item<float>(), h = 0.02f + 0.3f * torch::rand({1}).item<float>();
      targets[i][k] = torch::tensor({static_cast<float>(k % nc), std::max(0.f, cx - w / 2), std::max(0.f, cy - h / 2),
                                     std::min(1.f, cx + w / 2), std::min(1.f, cy + h / 2)});
    }
  }
  return {images, targets};
}

// A classification batch: random images and a class id per image.
std::pair<torch::Tensor, torch::Tensor> make_label_batch(int64_t b, int64_t s, int nc) {
  torch::manual_seed(0);
  return {torch::randint(0, 256, {b, s, s, 3}, torch::kUInt8), torch::randint(0, nc, {b}, torch::kLong)};
}

#ifdef LIBREYOLO_CUDA
// Where a step's time goes: CPU ops by inclusive host time and count, GPU kernel busy time, the
// top kernels. The answer decides what to optimise (host dispatch vs. GPU work).
json profile_steps(const std::function<void()>& step, int n) {
  using namespace torch::autograd::profiler;
  // Input shapes: ATen's own kernels (copies, adds, concatenations) are also split by the shapes
  // their launching op was called with, which tells which layer's tensors they move.
  torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<torch::profiler::impl::ActivityType> acts{torch::profiler::impl::ActivityType::CPU,
                                                     torch::profiler::impl::ActivityType::CUDA};
  prepareProfiler(cfg, acts);
  enableProfiler(cfg, acts);
  for (int i = 0; i < n; ++i) step();
  torch::cuda::synchronize();
  auto result = disableProfiler();
  std::map<std::string, std::pair<int64_t, double>> cpu, gpu, by_caller, aten_by_site;
  double kernel_us = 0;
  int64_t kernels = 0;
  uint64_t t_min = UINT64_MAX, t_max = 0;
  // Each kernel's launching op and that op's two enclosing ops (eager steps: a replayed graph's
  // kernels have no launching op), so that a kernel name shared by many callers (ATen's elementwise
  // copies) is split by where it comes from. Enclosure: same thread, time range inside.
  const auto& events = result->events();
  std::vector<size_t> ops;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].deviceType() == c10::DeviceType::CPU && events[i].activityType() == 0) ops.push_back(i);
  std::sort(ops.begin(), ops.end(), [&](size_t a, size_t b) {
    const auto &x = events[a], &y = events[b];
    if (x.startThreadId() != y.startThreadId()) return x.startThreadId() < y.startThreadId();
    if (x.startNs() != y.startNs()) return x.startNs() < y.startNs();
    return x.endNs() > y.endNs();
  });
  std::map<size_t, size_t> parent;  // event index -> enclosing op's event index
  std::map<uint64_t, size_t> op_of_correlation;
  std::vector<size_t> open;
  for (size_t k = 0; k < ops.size(); ++k) {
    const auto& e = events[ops[k]];
    if (k > 0 && events[ops[k - 1]].startThreadId() != e.startThreadId()) open.clear();
    while (!open.empty() && events[open.back()].endNs() < e.endNs()) open.pop_back();
    if (!open.empty()) parent[ops[k]] = open.back();
    open.push_back(ops[k]);
    op_of_correlation[e.correlationId()] = ops[k];
  }
  auto chain = [&](uint64_t correlation, int levels) {
    auto it = op_of_correlation.find(correlation);
    if (it == op_of_correlation.end()) return std::string("?");
    std::string c = events[it->second].name();
    size_t at = it->second;
    for (int up = 0; up < levels; ++up) {
      auto p = parent.find(at);
      if (p == parent.end()) break;
      at = p->second;
      c += " < " + events[at].name();
    }
    return c;
  };
  for (const auto& e : events) {
    const double us = e.durationNs() / 1000.0;
    if (e.deviceType() == c10::DeviceType::CUDA && e.activityType() == 5) {
      kernel_us += us;
      ++kernels;
      auto& g = gpu[e.name().substr(0, 90)];
      g.first++;
      g.second += us;
      auto& bc = by_caller[e.name().substr(0, 60) + " | " + chain(e.linkedCorrelationId(), 2)];
      bc.first++;
      bc.second += us;
      if (e.name().rfind("void at::native::", 0) == 0) {
        std::string shapes = "?";
        if (auto it = op_of_correlation.find(e.linkedCorrelationId()); it != op_of_correlation.end()) {
          shapes.clear();
          for (const auto& s : events[it->second].shapes()) {
            shapes += "[";
            for (size_t d = 0; d < s.size(); ++d) shapes += (d ? "," : "") + std::to_string(s[d]);
            shapes += "]";
          }
        }
        auto& site = aten_by_site[e.name().substr(17, 45) + " | " + chain(e.linkedCorrelationId(), 4) + " | " + shapes];
        site.first++;
        site.second += us;
      }
      t_min = std::min(t_min, e.startNs());
      t_max = std::max(t_max, e.endNs());
    } else if (e.deviceType() == c10::DeviceType::CPU && e.activityType() == 0) {
      auto& c = cpu[e.name()];
      c.first++;
      c.second += us;
    }
  }
  auto top = [&](const std::map<std::string, std::pair<int64_t, double>>& m, size_t k) {
    std::vector<std::pair<std::string, std::pair<int64_t, double>>> v(m.begin(), m.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    json out = json::array();
    for (size_t i = 0; i < std::min(k, v.size()); ++i)
      out.push_back({v[i].first, v[i].second.first / n, std::round(v[i].second.second / n)});
    return out;
  };
  return {{"steps", n}, {"kernels_per_step", kernels / n}, {"kernel_busy_ms_per_step", kernel_us / n / 1000.0},
          {"gpu_span_ms_per_step", (t_max - t_min) / 1e6 / n}, {"cpu_ops_top", top(cpu, 40)},
          {"kernels_top", top(gpu, 15)}, {"kernels_by_caller_top", top(by_caller, 30)},
          {"aten_kernels_by_site_top", top(aten_by_site, 60)}};
}

int64_t count_kernels(const std::function<void()>& step) {
  return profile_steps(step, 1)["kernels_per_step"].get<int64_t>();
}
#endif

struct Options {
  std::string device = "cpu", family = "yolo9", sizes = "t", batches = "8", dtypes = "fp32", memfmt = "auto",
              fused = "on", graphs = "off", scope = "auto";
  int steps = 24, warmup = 15;  // warm-up also lets cuDNN autotune and GPU clocks rise
  int imgsz = 0, nc = 0;        // 0: the family's input size (else 640); 80 (a classifier: 5)
  bool ema = false, kernels = true, diagnose = false, cudnn_benchmark = false;
};

// The scope --cuda-graph on captures (--graph-scope; auto: the deepest the family declares).
engine::GraphScope graph_scope(const Options& o, const models::Family& fam) {
  if (o.scope == "step") return engine::GraphScope::Step;
  if (o.scope == "network") return engine::GraphScope::Network;
  if (o.scope == "head") return engine::GraphScope::Head;
  if (o.scope != "auto")
    throw std::runtime_error("--graph-scope takes auto, step, network or head, not '" + o.scope + "'");
  return fam.capture_train_step      ? engine::GraphScope::Step
         : fam.capture_train_network ? engine::GraphScope::Network
                                     : engine::GraphScope::Head;
}

const char* scope_name(engine::GraphScope s) {
  return s == engine::GraphScope::Step ? "step" : s == engine::GraphScope::Network ? "network" : "head";
}

// Reads the command line into `o`; false (after a message) on an unknown argument.
bool parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value for " + a);
      return argv[++i];
    };
    if (a == "--device") o.device = val();
    else if (a == "--family") o.family = val();
    else if (a == "--sizes") o.sizes = val();
    else if (a == "--batches") o.batches = val();
    else if (a == "--dtypes") o.dtypes = val();
    else if (a == "--steps") o.steps = std::stoi(val());
    else if (a == "--warmup") o.warmup = std::stoi(val());
    else if (a == "--imgsz") o.imgsz = std::stoi(val());
    else if (a == "--nc") o.nc = std::stoi(val());
    else if (a == "--memory-format") o.memfmt = val();
    else if (a == "--ema") o.ema = true;
    else if (a == "--no-kernels") o.kernels = false;
    else if (a == "--diagnose") o.diagnose = true;
    else if (a == "--cudnn-benchmark") o.cudnn_benchmark = true;
    else if (a == "--fused") o.fused = val();
    else if (a == "--cuda-graph") o.graphs = val();
    else if (a == "--graph-scope") o.scope = val();
    else {
      std::cerr << "unknown argument " << a << "\n";
      return false;
    }
  }
  return true;
}

// One measured configuration.
struct Config {
  std::string size, dtype;
  int imgsz, nc;
  int64_t batch;
  bool fused;
  bool graph = false;
};

// Everything one configuration trains with: the model, its optional EMA copy, the step runner
// and the batch on the device.
struct Bench {
  std::shared_ptr<models::Detector> model, ema_model;
  std::unique_ptr<engine::ModelEMA> ema;
  engine::StepConfig sc;
  std::unique_ptr<engine::StepRunner> runner;
  torch::Tensor images, targets;

  void step() {
    runner->forward_backward(images, targets);
    runner->optimizer_step();
  }
};

std::unique_ptr<Bench> make_bench(const Options& o, const models::Family& fam, const torch::Device& dev,
                                  const Config& c) {
  auto b = std::make_unique<Bench>();
  b->model = fam.build(c.size, c.nc);
  b->model->to(dev);
  b->model->train();
  b->sc.device = dev;
  b->sc.amp = engine::plan_amp(c.dtype != "fp32", c.dtype == "bf16" ? "bfloat16" : "float16", dev);
  b->sc.channels_last = o.memfmt == "channels_last" || (o.memfmt == "auto" && dev.is_cuda());
  if (b->sc.channels_last) engine::to_channels_last(*b->model);
  if (o.ema) {
    b->ema_model = fam.build_like(models::state_dict(*b->model), c.nc);
    b->ema_model->to(dev);
    if (b->sc.channels_last) engine::to_channels_last(*b->ema_model);
    b->ema = std::make_unique<engine::ModelEMA>(b->ema_model, *b->model);
  }
  // The family's recipe (optimizer, its groups and rates, weight decay, gradient clipping) at a
  // constant-looking rate: no warm-up, no accumulation, a linear decay over a million steps.
  TrainConfig tc;
  train_schema().apply(tc, fam.train_defaults, "train");
  tc.scheduler = "linear";
  tc.batch = static_cast<int>(c.batch);
  tc.nbs = 0;
  tc.warmup_epochs = 0;
  tc.epochs = 1000000;
  b->runner = engine::make_step_runner(tc, b->model, fam.make_loss(*b->model), b->ema.get(), dev, b->sc.amp,
                                       b->sc.channels_last, /*batches_per_epoch=*/1, &fam)
                  .runner;
  if (c.graph) {
    const std::string why = b->runner->enable_cuda_graphs(3, graph_scope(o, fam));
    if (!why.empty()) throw std::runtime_error("--cuda-graph on: " + why);
  }
  auto [images, targets] =
      fam.task == "classify" ? make_label_batch(c.batch, c.imgsz, c.nc) : make_batch(c.batch, c.imgsz, c.nc);
  b->images = images.to(dev);
  b->targets = targets.to(dev);
  return b;
}

#ifdef LIBREYOLO_CUDA
// --diagnose: host synchronisations inside a step, phase times with a synchronisation after each
// phase (host wall, median of 7), and a profile of three steps.
json diagnose(Bench& b, const models::Family& fam, const torch::Device& dev, int imgsz) {
  json diag;
  for (int i = 0; i < 3; ++i) b.step();
  // Any host synchronisation inside the step?
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  try {
    b.step();
    diag["host_syncs"] = "none";
  } catch (const std::exception& e) {
    std::string m = e.what();
    diag["host_syncs"] = m.substr(0, std::min<size_t>(m.size(), 600));
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  libreyolo::synchronize(dev);
  auto phase_loss = fam.make_loss(*b.model);
  std::map<std::string, std::vector<double>> ph;
  auto mark = [&](const char* name, std::chrono::steady_clock::time_point& t) {
    libreyolo::synchronize(dev);
    auto now = std::chrono::steady_clock::now();
    ph[name].push_back(std::chrono::duration<double, std::milli>(now - t).count());
    t = now;
  };
  for (int i = 0; i < 7; ++i) {
    auto t = std::chrono::steady_clock::now();
    torch::Tensor x = b.runner->prepare_images(b.images);
    mark("prepare", t);
    std::vector<torch::Tensor> raw;
    {
      engine::AutocastGuard ac(dev, b.sc.amp.enabled, b.sc.amp.dtype);
      raw = b.model->forward_raw(x);
      mark("forward", t);
      auto out = phase_loss->compute(raw, b.targets, imgsz, imgsz);
      mark("loss", t);
      b.runner->scaler().scale(out.total).backward();
    }
    mark("backward", t);
    b.runner->optimizer_step();
    mark("optimizer", t);
  }
  for (auto& [k, v] : ph) {
    std::sort(v.begin(), v.end());
    diag["phase_ms_synced"][k] = v[v.size() / 2];
  }
  diag["profile"] = profile_steps([&] { b.step(); }, 3);
  return diag;
}
#endif

// Step times in ms after the warm-up, sorted. Peak memory statistics start after the warm-up.
// after_warmup runs between the warm-up and the statistics' reset.
std::vector<double> time_steps(Bench& b, const torch::Device& dev, int warmup, int steps,
                               const std::function<void()>& after_warmup = {}) {
  for (int i = 0; i < warmup; ++i) b.step();
  libreyolo::synchronize(dev);
  if (after_warmup) after_warmup();
#ifdef LIBREYOLO_CUDA
  if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
#endif
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    b.step();
    libreyolo::synchronize(dev);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

// Measures one configuration; returns its result object.
json run_config(const Options& o, const models::Family& fam, const torch::Device& dev, const Config& c) {
  models::set_fused_conv_training(c.fused);
#ifdef LIBREYOLO_CUDA
  // Each configuration's memory on its own: the previous one's cached blocks go back to the
  // device, and the whole-run peak (set-up, warm-up and any graph capture included) starts here.
  if (dev.is_cuda()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
  }
  int64_t run_peak_reserved = 0;
#endif
  auto b = make_bench(o, fam, dev, c);
  json diag;
#ifdef LIBREYOLO_CUDA
  if (o.diagnose && dev.is_cuda() && !c.graph) diag = diagnose(*b, fam, dev, c.imgsz);
#endif
  const std::vector<double> ms = time_steps(*b, dev, o.warmup, o.steps, [&] {
#ifdef LIBREYOLO_CUDA
    if (dev.is_cuda())
      run_peak_reserved = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index()).reserved_bytes[0].peak;
#endif
  });
  const int64_t B = c.batch;
  json r = {{"model", fam.name + c.size}, {"imgsz", c.imgsz}, {"nc", c.nc}, {"batch", B}, {"dtype", c.dtype}, {"channels_last", b->sc.channels_last},
            {"fused_conv", c.fused}, {"cudnn_benchmark", o.cudnn_benchmark}, {"cuda_graph", c.graph},
            {"min_ms", ms.front()}, {"median_ms", ms[ms.size() / 2]},
            {"img_per_s_at_min", 1000.0 * B / ms.front()}, {"img_per_s_at_median", 1000.0 * B / ms[ms.size() / 2]}};
#ifdef LIBREYOLO_CUDA
  if (dev.is_cuda()) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    r["peak_allocated_gb"] = static_cast<double>(st.allocated_bytes[0].peak) / 1e9;
    r["peak_reserved_gb"] = static_cast<double>(st.reserved_bytes[0].peak) / 1e9;
    // Reserved memory at its highest from set-up to the end of the warm-up: with graphs, their
    // private pool (captured during the warm-up) is in it; the timed window's peaks above are not
    // a fair eager-vs-graphed comparison (a graph's activations live in reserved, not allocated).
    r["peak_reserved_incl_warmup_gb"] =
        static_cast<double>(std::max<int64_t>(run_peak_reserved, st.reserved_bytes[0].peak)) / 1e9;
    if (o.kernels) {
      try {
        const json prof = profile_steps([&] { b->step(); }, 3);
        r["kernels_per_step"] = prof["kernels_per_step"];
        r["gpu_busy_ms_per_step"] = prof["kernel_busy_ms_per_step"];
        // First kernel start to last kernel end: below the busy sum when kernels overlap (streams).
        r["gpu_span_ms_per_step"] = prof["gpu_span_ms_per_step"];
        json top = json::array();
        for (const auto& k : prof["kernels_top"]) {
          if (top.size() >= 15) break;
          top.push_back(k);
        }
        r["kernels_top"] = top;
      } catch (const std::exception& e) {
        r["kernels_per_step_error"] = e.what();
      }
    }
  }
#endif
  if (!diag.is_null()) r["diagnose"] = diag;
  if (c.graph) {
    const auto g = b->runner->graph_stats();
    r["graph"] = {{"enabled", g.enabled}, {"off_reason", g.off_reason}, {"captured_shapes", g.captured_shapes},
                  {"update_captured", g.update_captured}, {"replayed_steps", g.replayed_micro_steps},
                  {"eager_steps", g.eager_micro_steps}, {"replayed_heads", g.replayed_heads}, {"replayed_losses", g.replayed_losses},
                  {"scope", scope_name(graph_scope(o, fam))}};
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  libreyolo::install_crash_report();  // a fatal signal prints its stack, as the CLI does
  Options o;
  if (!parse_args(argc, argv, o)) return 2;
  torch::Device dev = o.device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (dev.is_cuda() && !torch::cuda::is_available()) {
    std::cerr << "no CUDA device\n";
    return 1;
  }
  // The caching allocator's per-device state exists only once CUDA is initialised (lazily, by the
  // first allocation); its statistics calls in run_config would otherwise fail on a fresh process.
  if (dev.is_cuda()) (void)torch::empty({1}, torch::TensorOptions().device(dev));
  const models::Family* fam = models::find_family(o.family);
  if (!fam) {
    std::cerr << "unknown family " << o.family << "\n";
    return 2;
  }
  for (const std::string& line : configure_cudnn(o.cudnn_benchmark)) std::fprintf(stderr, "%s\n", line.c_str());
  json out = {{"benchmark", "train_step"}, {"device", dev.str()}, {"steps", o.steps},
              {"warmup", o.warmup}, {"ema", o.ema}, {"results", json::array()}};
  const std::vector<bool> fused_modes =
      o.fused == "both" ? std::vector<bool>{true, false} : std::vector<bool>{o.fused != "off"};
  const int nc = o.nc > 0 ? o.nc : fam->task == "classify" ? 5 : 80;
  for (const auto& size : split(o.sizes)) {
    const int imgsz = o.imgsz > 0 ? o.imgsz : fam->input_size ? fam->input_size(size) : 640;
    for (const auto& bs : split(o.batches)) {
      for (const auto& dt : split(o.dtypes)) {
        for (bool fused_on : fused_modes) {
          for (const auto& gm : split(o.graphs)) {
            json r = run_config(o, *fam, dev, Config{size, dt, imgsz, nc, std::stoll(bs), fused_on, gm == "on"});
            out["results"].push_back(r);
            std::cerr << r.dump() << "\n";
          }
        }
      }
    }
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
