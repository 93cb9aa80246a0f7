#include "profile/analysis.hpp"
#include "core/strings.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <libreyolo/errors.hpp>

namespace libreyolo::profile {

using libreyolo::lower;

namespace fs = std::filesystem;

double round_to(double v, int digits) {
  if (!std::isfinite(v)) return 0.0;
  const double m = std::pow(10.0, digits);
  return std::round(v * m) / m;
}

namespace {

bool contains(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

// ------------------------------------------------------------------ categoriser
struct CatRule {
  const char* category;
  std::regex re;
};

const std::vector<CatRule>& cat_rules() {
  static const std::vector<CatRule> rules = [] {
    const auto f = std::regex::ECMAScript | std::regex::optimize;
    std::vector<CatRule> r;
    r.push_back({"reduction / norm",
                 std::regex("bn_bw|bn_fw|\\bbn_(stats|apply|backward)|batchnorm|batch_norm|layer_norm|group_norm|instance_norm|softmax|welford|"
                            "\\breduce|variance|rms_norm",
                            f)});
    r.push_back({"layout / copy", std::regex("nchwtonhwc|nhwctonchw", f)});
    // 1.6.0's gemm/conv rule plus the Hopper names: sm90_xmma*, nvjet* (cuBLASLt), cutlass*,
    // (h/wg)gmma, and cuDNN's runtime-fusion / generated kernels.
    r.push_back({"gemm / conv",
                 std::regex("gemm|conv|implicit|cutlass|cudnn|wgrad|dgrad|winograd|xmma|nvjet|gmma|"
                            "runtime_fusion|fusion_engine|fprop",
                            f)});
    r.push_back({"layout / copy",
                 std::regex("memcpy|memset|\\bcopy|catarray|concat|contiguous|\\bgather|\\bscatter|\\bpermute|"
                            "\\btranspose",
                            f)});
    r.push_back({"elementwise",
                 std::regex("elementwise|vectorized|pointwise|activation|silu|relu|sigmoid|unary|binary|clamp|fill|"
                            "arange",
                            f)});
    return r;
  }();
  return rules;
}

}  // namespace

std::string kernel_category(const std::string& raw_name) {
  const std::string l = lower(raw_name);
  for (const auto& r : cat_rules())
    if (std::regex_search(l, r.re)) return r.category;
  return "other";
}

bool is_tensorcore(const std::string& raw_name) {
  const std::string l = lower(raw_name);
  static const char* ampere[] = {"h884", "h1688", "i16832", "i8816", "s16816", "s1688", "hmma", "imma", "tensorop",
                                 "wmma", "16816", "16832", "884gemm", "1688gemm"};
  for (const char* m : ampere)
    if (contains(l, m)) return true;
  // Hopper and cuDNN/cuBLASLt families are tensor-core kernels unless they are plain fp32
  // (f32f32_f32f32 without tf32), which runs on the FMA pipes.
  const bool family = contains(l, "xmma") || contains(l, "nvjet") || contains(l, "gmma") || contains(l, "cutlass");
  if (!family) return false;
  if (contains(l, "tf32")) return true;
  if (contains(l, "f32f32_f32f32") || contains(l, "_sgemm") || contains(l, "fp32fp32")) return false;
  return true;
}

std::string kernel_label(const std::string& raw_name) {
  const std::string l = lower(raw_name);
  static const std::vector<std::pair<const char*, const char*>> table = {
      {"bn_stats", "fused batchnorm stats"},
      {"bn_apply_act", "fused batchnorm+act"},
      {"bn_backward_reduce", "fused batchnorm (bwd reduce)"},
      {"bn_backward_elemt", "fused batchnorm+act (bwd)"},
      {"bn_bw", "cudnn batchnorm (bwd)"},
      {"bn_fw", "cudnn batchnorm (fwd)"},
      {"nchwtonhwc", "layout nchw->nhwc"},
      {"nhwctonchw", "layout nhwc->nchw"},
      {"implicitgemm", "cutlass conv (implicit gemm)"},
      {"implicit_convolve", "implicit conv"},
      {"wgrad", "conv wgrad"},
      {"dgrad", "conv dgrad"},
      {"cgemm", "gemm"},
      {"sgemm", "gemm"},
      {"gemm", "gemm"},
      {"vectorized_elementwise", "elementwise"},
      {"elementwise", "elementwise"},
      {"softmax", "softmax"},
      {"reduce", "reduction"},
      {"cat", "concat"},
  };
  for (const auto& [sub, label] : table)
    if (contains(l, sub)) return label;
  return raw_name.substr(0, 40);
}

double union_length(std::vector<std::pair<double, double>> iv) {
  if (iv.empty()) return 0.0;
  std::sort(iv.begin(), iv.end());
  double total = 0, cs = iv[0].first, ce = iv[0].second;
  for (size_t i = 1; i < iv.size(); ++i) {
    if (iv[i].first <= ce) {
      ce = std::max(ce, iv[i].second);
    } else {
      total += std::max(0.0, ce - cs);
      cs = iv[i].first;
      ce = iv[i].second;
    }
  }
  total += std::max(0.0, ce - cs);
  return total;
}

// ------------------------------------------------------------------ verdict
Verdict decide(const VerdictInputs& in) {
  char buf[512];
  const long long mallocs = static_cast<long long>(in.cuda_mallocs_per_step);
  if (in.cuda_mallocs_per_step >= 5 || (!in.cpu && in.util > 1.05)) {
    std::string util_part;
    if (in.util > 1.05) {
      std::snprintf(buf, sizeof buf, "; util read %.0f%%", in.util * 100);
      util_part = buf;
    }
    std::snprintf(buf, sizeof buf,
                  "allocator thrash (~%lld cudaMalloc/free per step%s) \u2014 VRAM pressure; throughput and "
                  "utilisation here are unreliable",
                  mallocs, util_part.c_str());
    return {"memory-pressure", buf};
  }
  const char* dev = in.cpu ? "CPU" : "GPU";
  const double util = std::min(in.util, 1.0);
  // Waiting on input limits the run only when the device is idle meanwhile. A saturated device
  // (a captured step runs ahead of the host, which then waits on the loader while the GPU
  // works) is compute-bound whatever the training thread's wait: a faster loader would not
  // shorten the step. (The reference tests dataloader first; it never overlaps the two.)
  const bool saturated = util >= 0.8;
  if (in.dataload_frac && *in.dataload_frac >= 0.2 && !saturated) {
    std::snprintf(buf, sizeof buf, "the %s waits on input data (~%.0f%% of the step)", dev, *in.dataload_frac * 100);
    return {"dataloader", buf};
  }
  if (saturated) {
    if (in.cpu)
      std::snprintf(buf, sizeof buf, "the CPU is saturated with ops (~%.0f%% of the step inside ops)", util * 100);
    else
      std::snprintf(buf, sizeof buf, "the GPU is saturated (~%.0f%% busy)", util * 100);
    std::string why = buf;
    if (in.dataload_frac && *in.dataload_frac >= 0.2) {
      std::snprintf(buf, sizeof buf, "; the input waits (~%.0f%% of the step) overlap its work", *in.dataload_frac * 100);
      why += buf;
    }
    return {"compute", why};
  }
  std::string why;
  if (in.cpu) {
    std::snprintf(buf, sizeof buf,
                  "CPU ops fill only ~%.0f%% of the step \u2014 the rest is host overhead around %.0f ops/step",
                  util * 100, in.ops_per_step);
  } else {
    std::snprintf(buf, sizeof buf,
                  "GPU only ~%.0f%% busy \u2014 fed too slowly: %.0f kernels/step at ~%.0fus each plus host overhead",
                  util * 100, in.kernels_per_step, in.mean_kernel_us);
  }
  why = buf;
  if (!in.dataload_frac) why += " (dataloader stall not measurable from trace alone)";
  return {"host / launch", why};
}

std::string bound_label(const std::string& bound) {
  if (bound == "dataloader") return "DATALOADER-BOUND";
  if (bound == "host / launch") return "HOST/LAUNCH-BOUND";
  if (bound == "compute") return "COMPUTE-BOUND";
  if (bound == "memory-pressure") return "MEMORY-PRESSURE";
  std::string u = bound;
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

std::string bound_lever(const std::string& bound, bool cpu) {
  if (bound == "dataloader") return "workers\u2191, cache='ram'/'disk', lighter aug, larger batch";
  if (bound == "host / launch")
    return cpu ? "larger batch (amortize per-op overhead), fewer per-step .item()/syncs, op fusion"
               : "larger batch (amortize launches), fewer per-step .item()/syncs, CUDA graphs, op fusion";
  if (bound == "compute") return cpu ? "already op-bound on the CPU \u2014 a GPU, a smaller model or a smaller imgsz"
                                     : "already GPU-bound \u2014 try AMP/bf16 or a larger model";
  if (bound == "memory-pressure") return "lower batch, reduce activation memory, avoid running at the OOM edge";
  return "";
}

// ------------------------------------------------------------------ trace parsing
namespace {

enum class Kind { Step, Kernel, Memcpy, Memset, CpuOp, Runtime, CpuAnn, GpuAnn, FlowS, FlowF };

struct Ev {
  Kind kind;
  double ts = 0, dur = 0;  // microseconds
  std::string name;
  long long tid = 0;
  long long corr = -1;  // correlation id (kernels, runtime), or flow id
};

long long id_of(const json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_number_unsigned()) return static_cast<long long>(v.get<unsigned long long>());
  if (v.is_number_float()) return static_cast<long long>(v.get<double>());
  if (v.is_string()) return static_cast<long long>(std::hash<std::string>{}(v.get<std::string>()) >> 1);
  return 0;
}

double num(const json& v, double fallback = 0) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    try {
      return std::stod(v.get<std::string>());
    } catch (...) {
    }
  }
  return fallback;
}

struct Parsed {
  std::vector<Ev> ev;
  bool any_kernel = false;
};

Parsed parse_trace(const json& trace) {
  if (!trace.is_object()) throw std::runtime_error("not a JSON object");
  if (!trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    throw std::runtime_error("no traceEvents: neither a Kineto/Chrome trace nor a profile.json");
  Parsed p;
  for (const auto& e : trace["traceEvents"]) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    const std::string cat = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    const std::string name = e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "";
    Ev ev{};
    if (ph == "X") {
      if (name.rfind("ProfilerStep", 0) == 0) {
        if (cat == "gpu_user_annotation") continue;  // the GPU copy of a marker
        ev.kind = Kind::Step;
      } else if (cat == "kernel") {
        ev.kind = Kind::Kernel;
        p.any_kernel = true;
      } else if (cat == "gpu_memcpy") {
        ev.kind = Kind::Memcpy;
      } else if (cat == "gpu_memset") {
        ev.kind = Kind::Memset;
      } else if (cat == "cpu_op") {
        ev.kind = Kind::CpuOp;
      } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
        ev.kind = Kind::Runtime;
      } else if (cat == "user_annotation" && name.rfind("step/", 0) == 0) {
        ev.kind = Kind::CpuAnn;
      } else if (cat == "gpu_user_annotation" && name.rfind("step/", 0) == 0) {
        ev.kind = Kind::GpuAnn;
      } else {
        continue;
      }
      ev.dur = std::max(0.0, num(e.value("dur", json(0))));
    } else if ((ph == "s" || ph == "f") && cat == "ac2g" && e.contains("id")) {
      ev.kind = ph == "s" ? Kind::FlowS : Kind::FlowF;
      ev.corr = id_of(e["id"]);
    } else {
      continue;
    }
    ev.ts = num(e.value("ts", json(0)));
    ev.name = name;
    if (e.contains("tid")) ev.tid = id_of(e["tid"]);
    if (ev.kind != Kind::FlowS && ev.kind != Kind::FlowF && e.contains("args") && e["args"].is_object()) {
      const auto& a = e["args"];
      if (a.contains("correlation")) ev.corr = id_of(a["correlation"]);
    }
    p.ev.push_back(std::move(ev));
  }
  return p;
}

struct WindowSel {
  double w0 = -std::numeric_limits<double>::infinity();
  double w1 = std::numeric_limits<double>::infinity();
  int n_real = 1;
  double wall_us = 0;  // with markers: the time inside the selected steps' spans only
  bool has_markers = false;
  // The selected steps' spans (ProfilerStep markers), sorted and disjoint. Work launched between
  // them (epoch-end validation, checkpoint writes, the profiler's own bookkeeping) is not part of
  // a training step and is left out of every per-step figure.
  std::vector<std::pair<double, double>> spans;
  bool in_range(double ts) const { return ts >= w0 && ts < w1; }
  bool in(double ts) const {
    if (!in_range(ts)) return false;
    if (spans.empty()) return true;
    auto it = std::upper_bound(spans.begin(), spans.end(), std::make_pair(ts, std::numeric_limits<double>::infinity()));
    if (it == spans.begin()) return false;
    --it;
    return ts >= it->first && ts < it->second;
  }
};

const json* jget(const json* j, const char* a, const char* b = nullptr) {
  if (!j || !j->is_object() || !j->contains(a)) return nullptr;
  const json* x = &(*j)[a];
  if (!b) return x;
  if (!x->is_object() || !x->contains(b)) return nullptr;
  return &(*x)[b];
}

std::optional<double> jnum(const json* j, const char* a, const char* b = nullptr) {
  const json* x = jget(j, a, b);
  if (!x || !x->is_number()) return std::nullopt;
  return x->get<double>();
}

WindowSel select_window(const Parsed& p, const json* summary) {
  std::vector<const Ev*> marks;
  for (const auto& e : p.ev)
    if (e.kind == Kind::Step) marks.push_back(&e);
  std::sort(marks.begin(), marks.end(), [](const Ev* a, const Ev* b) { return a->ts < b->ts; });
  WindowSel w;
  const int n = static_cast<int>(marks.size());
  if (n == 0) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& e : p.ev) {
      lo = std::min(lo, e.ts);
      hi = std::max(hi, e.ts + e.dur);
    }
    w.wall_us = hi > lo ? hi - lo : 0;
    return w;
  }
  const auto real_steps = jnum(summary, "window", "real_steps");
  if (real_steps && *real_steps >= 1) {
    // Our own window: the whole unsynced half. It is bounded by device syncs (window.cpp), so
    // it has no backlog to settle; leaving its first steps out would charge the queue they left
    // for the GPU (drained in its last step) to the others.
    const int c = std::min(static_cast<int>(*real_steps), n);
    w.w0 = marks[0]->ts;
    w.w1 = c < n ? marks[c]->ts : marks[n - 1]->ts + marks[n - 1]->dur;
  } else if (n >= 4) {  // a raw trace: 1.6.0's rule
    w.w0 = marks[2]->ts;
    w.w1 = marks[std::min(n - 1, 8)]->ts;
  } else {
    w.w0 = marks[0]->ts;
    w.w1 = marks[n - 1]->ts + marks[n - 1]->dur;
  }
  if (w.w1 <= w.w0) w.w1 = w.w0 + 1;
  std::set<std::string> ids;
  std::vector<double> starts;
  std::vector<std::pair<double, double>> spans;
  for (const Ev* m : marks) {
    if (!w.in(m->ts)) continue;
    starts.push_back(m->ts);
    spans.emplace_back(m->ts, std::min(m->ts + std::max(m->dur, 1.0), w.w1));
    auto pos = m->name.find('#');
    if (pos != std::string::npos) ids.insert(m->name.substr(pos + 1));
  }
  int n_real = static_cast<int>(ids.size());
  if (n_real == 0 && !starts.empty()) {
    n_real = 1;
    for (size_t i = 1; i < starts.size(); ++i)
      if (starts[i] - starts[i - 1] > 1.0) ++n_real;
  }
  w.n_real = std::max(1, n_real);
  // Disjoint spans (a marker nested in another, as a second profiler's would be, counts once).
  std::sort(spans.begin(), spans.end());
  for (const auto& sp : spans) {
    if (!w.spans.empty() && sp.first < w.spans.back().second)
      w.spans.back().second = std::max(w.spans.back().second, sp.second);
    else
      w.spans.push_back(sp);
  }
  w.wall_us = 0;
  for (const auto& sp : w.spans) w.wall_us += sp.second - sp.first;
  w.has_markers = true;
  return w;
}

// Phase spans from the CPU annotations, sorted, for "which phase holds this timestamp".
struct Spans {
  std::vector<std::tuple<double, double, std::string>> s;  // start, end, phase
  void build(const Parsed& p) {
    for (const auto& e : p.ev)
      if (e.kind == Kind::CpuAnn) s.emplace_back(e.ts, e.ts + e.dur, e.name.substr(5));
    std::sort(s.begin(), s.end());
  }
  std::string at(double ts) const {
    auto it = std::upper_bound(s.begin(), s.end(), ts,
                               [](double t, const std::tuple<double, double, std::string>& x) { return t < std::get<0>(x); });
    // Spans do not nest, but walk back a few in case of overlap.
    for (int k = 0; k < 4 && it != s.begin(); ++k) {
      --it;
      if (ts >= std::get<0>(*it) && ts < std::get<1>(*it)) return std::get<2>(*it);
    }
    return "unphased";
  }
};

const std::vector<std::string>& phase_order() {
  static const std::vector<std::string> o = {"dataload", "to_device", "preprocess", "forward", "loss",
                                             "backward", "postprocess", "optimizer"};
  return o;
}

struct KAgg {
  double us = 0;
  long long count = 0;
};

json krows(const std::map<std::string, KAgg>& agg, int n_real, size_t limit) {
  double total = 0;
  for (const auto& [k, a] : agg) total += a.us;
  std::vector<std::pair<std::string, KAgg>> rows(agg.begin(), agg.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  json out = json::array();
  for (const auto& [name, a] : rows) {
    if (out.size() >= limit) break;
    out.push_back({{"kernel", kernel_label(name)},
                   {"raw_name", name.substr(0, 90)},
                   {"category", kernel_category(name)},
                   {"tensorcore", is_tensorcore(name)},
                   {"ms_per_step", round_to(a.us / 1000.0 / n_real, 4)},
                   {"pct_of_gpu", round_to(total > 0 ? a.us / total * 100 : 0, 2)},
                   {"count_per_step", std::max<long long>(a.count / n_real, 1)}});
  }
  return out;
}

json orows(const std::map<std::string, KAgg>& agg, int n_real, size_t limit) {
  double total = 0;
  for (const auto& [k, a] : agg) total += a.us;
  std::vector<std::pair<std::string, KAgg>> rows(agg.begin(), agg.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  json out = json::array();
  for (const auto& [name, a] : rows) {
    if (out.size() >= limit) break;
    out.push_back({{"op", name.substr(0, 70)},
                   {"ms_per_step", round_to(a.us / 1000.0 / n_real, 4)},
                   {"pct_of_cpu_ops", round_to(total > 0 ? a.us / total * 100 : 0, 2)},
                   {"count_per_step", std::max<long long>(a.count / n_real, 1)}});
  }
  return out;
}

json value_or_null(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

json analyze_trace(const json& trace, const json* summary, const std::string& trace_path) {
  const Parsed p = parse_trace(trace);
  const WindowSel w = select_window(p, summary);
  const int n_real = w.n_real;
  Spans spans;
  spans.build(p);

  const json* meta = jget(summary, "meta");
  const std::string device = meta && meta->contains("device") && (*meta)["device"].is_string()
                                 ? (*meta)["device"].get<std::string>()
                                 : "";
  const bool cpu = !p.any_kernel && device.rfind("cuda", 0) != 0;

  // Launch time of each correlation id (CPU side of a kernel).
  std::unordered_map<long long, double> launch_ts;
  for (const auto& e : p.ev)
    if (e.kind == Kind::Runtime && e.corr >= 0) launch_ts.emplace(e.corr, e.ts);

  std::map<std::string, KAgg> kernels, ops;
  std::map<std::string, std::map<std::string, KAgg>> k_by_phase, o_by_phase;
  std::map<std::string, std::set<std::string>> uniq_by_phase;
  std::map<std::string, double> gpu_us_by_phase;
  std::map<std::string, long long> kcount_by_phase, ocount_by_phase;
  std::set<std::string> annotated;  // phases with a CPU or GPU annotation in the window
  std::vector<std::pair<double, double>> kern_iv, dataload_iv;
  double kern_sum = 0, tc_us = 0, memcpy_us = 0, ops_us = 0;
  long long n_kern = 0, n_ops = 0, mallocs = 0;
  std::map<std::string, double> cat_us;

  // Training thread: the one that wrote the step markers (for CPU busy time).
  std::optional<long long> main_tid;
  for (const auto& e : p.ev)
    if (e.kind == Kind::Step) {
      main_tid = e.tid;
      break;
    }

  for (const auto& e : p.ev) {
    // A kernel belongs to the step that launched it (it may run after the step's CPU span ends).
    double at = e.ts;
    if (e.kind == Kind::Kernel && e.corr >= 0) {
      auto it = launch_ts.find(e.corr);
      if (it != launch_ts.end()) at = it->second;
    }
    if (!w.in(at)) continue;
    switch (e.kind) {
      case Kind::Kernel: {
        ++n_kern;
        kern_sum += e.dur;
        kern_iv.emplace_back(e.ts, e.ts + e.dur);
        auto& k = kernels[e.name];
        k.us += e.dur;
        ++k.count;
        if (is_tensorcore(e.name)) tc_us += e.dur;
        cat_us[kernel_category(e.name)] += e.dur;
        const std::string ph = spans.at(at);
        auto& kp = k_by_phase[ph][e.name];
        kp.us += e.dur;
        ++kp.count;
        gpu_us_by_phase[ph] += e.dur;
        ++kcount_by_phase[ph];
        uniq_by_phase[ph].insert(e.name);
        break;
      }
      case Kind::Memcpy:
      case Kind::Memset:
        memcpy_us += e.dur;
        break;
      case Kind::CpuOp: {
        ++n_ops;
        ops_us += e.dur;
        auto& o = ops[e.name];
        o.us += e.dur;
        ++o.count;
        const std::string ph = spans.at(e.ts);
        auto& op = o_by_phase[ph][e.name];
        op.us += e.dur;
        ++op.count;
        ++ocount_by_phase[ph];
        break;
      }
      case Kind::Runtime:
        if (contains(e.name, "Malloc") || contains(e.name, "Free")) ++mallocs;
        break;
      case Kind::CpuAnn:
      case Kind::GpuAnn:
        annotated.insert(e.name.substr(5));
        if (e.kind == Kind::CpuAnn && e.name == "step/dataload") dataload_iv.emplace_back(e.ts, e.ts + e.dur);
        break;
      default:
        break;
    }
  }

  // Busy time: the union of kernel intervals; on a CPU-only trace, the union of the training
  // thread's CPU ops outside the dataload spans.
  double busy_us = 0;
  if (cpu) {
    std::sort(dataload_iv.begin(), dataload_iv.end());
    auto in_dataload = [&](double ts) {
      auto it = std::upper_bound(dataload_iv.begin(), dataload_iv.end(), std::make_pair(ts, std::numeric_limits<double>::infinity()));
      if (it == dataload_iv.begin()) return false;
      --it;
      return ts >= it->first && ts < it->second;
    };
    std::vector<std::pair<double, double>> op_iv;
    for (const auto& e : p.ev)
      if (e.kind == Kind::CpuOp && w.in(e.ts) && (!main_tid || e.tid == *main_tid) && !in_dataload(e.ts))
        op_iv.emplace_back(e.ts, e.ts + e.dur);
    busy_us = union_length(std::move(op_iv));
  } else {
    busy_us = union_length(kern_iv);
  }

  const auto s_step = jnum(summary, "real", "step_ms");
  const double step_ms = s_step && *s_step > 0 ? *s_step : w.wall_us / 1000.0 / n_real;
  const auto dataload_ms = jnum(summary, "real", "dataload_ms");
  const auto dataload_frac = jnum(summary, "real", "dataload_frac");
  std::optional<double> img_per_s = jnum(summary, "real", "img_per_s");
  const double busy_ms = busy_us / 1000.0 / n_real;


  // when steps vary.
  const double window_step_ms = w.has_markers ? w.wall_us / 1000.0 / n_real : step_ms;
  const double util_raw = window_step_ms > 0 ? busy_ms / window_step_ms : 0;
  const double util = std::min(util_raw, 1.0);
  const long long mallocs_ps = mallocs / n_real;
  const bool memory_pressure = mallocs_ps >= 5 || (!cpu && util_raw > 1.05);
  const long long kernels_ps = n_kern / n_real;
  const double mean_kernel_us = n_kern ? kern_sum / n_kern : 0;
  const double host_ms = std::max(window_step_ms - busy_ms - dataload_ms.value_or(0), 0.0);
  const long long ops_ps = n_ops / n_real;

  VerdictInputs vi;
  vi.util = util_raw;
  vi.cuda_mallocs_per_step = static_cast<double>(mallocs_ps);
  vi.dataload_frac = dataload_frac;
  vi.kernels_per_step = static_cast<double>(kernels_ps);
  vi.mean_kernel_us = mean_kernel_us;
  vi.ops_per_step = static_cast<double>(ops_ps);
  vi.cpu = cpu;
  const Verdict v = decide(vi);

  json out;
  out["schema"] = kSchema;
  out["trace"] = trace_path;
  out["model"] = meta && meta->contains("model") ? (*meta)["model"] : json(nullptr);
  out["config"] = meta ? *meta : json::object();
  out["bound"] = v.bound;
  out["bound_why"] = v.why;
  out["lever"] = bound_lever(v.bound, cpu);
  out["busy_source"] = cpu ? "cpu_ops" : "gpu_kernels";
  out["step_ms"] = round_to(step_ms, 2);
  out["window_step_ms"] = round_to(window_step_ms, 3);
  out["img_per_s"] = value_or_null(img_per_s);
  out["dataload_ms"] = value_or_null(dataload_ms);
  out["dataload_frac"] = value_or_null(dataload_frac);
  out["gpu_util"] = round_to(util, 3);
  out["gpu_util_raw"] = round_to(util_raw, 3);
  out["memory_pressure"] = memory_pressure;
  out["cuda_mallocs_per_step"] = mallocs_ps;
  out["host_overhead_ms_per_step"] = round_to(host_ms, 2);
  out["launches_per_step"] = kernels_ps;
  out["gpu_busy_ms_per_step"] = round_to(busy_ms, 2);
  out["gpu_busy_sum_ms_per_step"] = round_to(kern_sum / 1000.0 / n_real, 2);
  out["mean_kernel_us"] = round_to(mean_kernel_us, 2);
  out["kernels_per_step"] = kernels_ps;
  out["unique_kernels"] = static_cast<long long>(kernels.size());
  out["memcpy_ms_per_step"] = round_to(memcpy_us / 1000.0 / n_real, 3);
  out["tensorcore_pct"] = round_to(kern_sum > 0 ? tc_us / kern_sum * 100 : 0, 1);
  out["peak_vram_mb"] = value_or_null(jnum(summary, "analysis", "peak_vram_mb"));
  if (!summary || !jget(summary, "analysis", "peak_vram_mb")) {
    const auto pv = jnum(summary, "peak_vram_mb");
    out["peak_vram_mb"] = value_or_null(pv);
  }
  out["window"] = {{"wall_ms", round_to(w.wall_us / 1000.0, 1)}, {"real_steps", n_real}};

  // Categories by time.
  json cats = json::array();
  {
    std::vector<std::pair<std::string, double>> cv(cat_us.begin(), cat_us.end());
    std::stable_sort(cv.begin(), cv.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [name, us] : cv) {
      if (us <= 0) continue;
      cats.push_back({{"name", name},
                      {"pct", round_to(kern_sum > 0 ? us / kern_sum * 100 : 0, 1)},
                      {"ms_per_step", round_to(us / 1000.0 / n_real, 3)}});
    }
  }
  out["categories"] = cats;

  // Phase rows.
  std::vector<std::string> phases;
  auto has = [&](const std::string& ph) {
    return annotated.count(ph) || kcount_by_phase.count(ph) || ocount_by_phase.count(ph);
  };
  for (const auto& ph : phase_order())
    if (has(ph)) phases.push_back(ph);
  std::set<std::string> extra;
  for (const auto& [ph, c] : kcount_by_phase) extra.insert(ph);
  for (const auto& [ph, c] : ocount_by_phase) extra.insert(ph);
  for (const auto& ph : annotated) extra.insert(ph);
  for (const auto& ph : extra)
    if (std::find(phases.begin(), phases.end(), ph) == phases.end()) phases.push_back(ph);

  const json* comp = jget(summary, "composition_ms");
  json rows = json::array(), rows_gpu = json::array();
  json metrics = {{"img_per_s", out["img_per_s"]},
                  {"step_ms", out["step_ms"]},
                  {"dataload_ms", out["dataload_ms"]},
                  {"dataload_frac", out["dataload_frac"]},
                  {"gpu_util", out["gpu_util"]},
                  {"gpu_busy_ms", out["gpu_busy_ms_per_step"]},
                  {"mean_kernel_us", out["mean_kernel_us"]},
                  {"kernels_per_step", out["kernels_per_step"]},
                  {"unique_kernels", out["unique_kernels"]},
                  {"ops_per_step", ops_ps},
                  {"memcpy_ms", out["memcpy_ms_per_step"]},
                  {"tensorcore_pct", out["tensorcore_pct"]},
                  {"peak_vram_mb", out["peak_vram_mb"]},
                  {"host_overhead_ms", out["host_overhead_ms_per_step"]},
                  {"launches_per_step", out["launches_per_step"]},
                  {"cuda_mallocs_per_step", out["cuda_mallocs_per_step"]},
                  {"memory_pressure", out["memory_pressure"]},
                  {"bound", out["bound"]}};
  json kbp = json::object(), obp = json::object();
  for (const auto& ph : phases) {
    const double gpu_ms = round_to(gpu_us_by_phase.count(ph) ? gpu_us_by_phase[ph] / 1000.0 / n_real : 0, 3);
    json wall = nullptr;
    if (ph == "dataload" && dataload_ms) {
      wall = round_to(*dataload_ms, 2);
    } else if (comp && comp->is_object() && comp->contains(ph) && (*comp)[ph].is_number()) {
      wall = round_to((*comp)[ph].get<double>(), 2);
    }
    const long long kc = kcount_by_phase.count(ph) ? kcount_by_phase[ph] / n_real : 0;
    const long long oc = ocount_by_phase.count(ph) ? ocount_by_phase[ph] / n_real : 0;
    const long long uk = uniq_by_phase.count(ph) ? static_cast<long long>(uniq_by_phase[ph].size()) : 0;
    rows.push_back({{"phase", ph},
                    {"gpu_ms_per_step", gpu_ms},
                    {"wall_ms_per_step", wall},
                    {"kernels_per_step", kc},
                    {"ops_per_step", oc},
                    {"unique_kernels", uk}});
    rows_gpu.push_back({{"phase", ph}, {"gpu_ms_per_step", gpu_ms}});
    metrics[ph + "_gpu_ms"] = gpu_ms;
    metrics[ph + "_wall_ms"] = wall;
    metrics[ph + "_kernels"] = kc;
    metrics[ph + "_ops"] = oc;
    kbp[ph] = k_by_phase.count(ph) ? krows(k_by_phase[ph], n_real, 40) : json::array();
    obp[ph] = o_by_phase.count(ph) ? orows(o_by_phase[ph], n_real, 40) : json::array();
  }
  out["metrics"] = metrics;
  out["phases"] = rows;
  out["phases_gpu"] = rows_gpu;
  out["kernels_by_phase"] = kbp;
  out["ops_by_phase"] = obp;
  json all = krows(kernels, n_real, std::numeric_limits<size_t>::max());
  json top = json::array();
  for (size_t i = 0; i < all.size() && i < 8; ++i) top.push_back(all[i]);
  out["top_kernels"] = top;
  out["kernels"] = all;
  out["ops"] = orows(ops, n_real, std::numeric_limits<size_t>::max());
  return out;
}

// ------------------------------------------------------------------ timeline payload
json timeline_events(const json& trace, const json* summary) {
  const Parsed p = parse_trace(trace);
  const WindowSel w = select_window(p, summary);
  struct TE {
    double ts, dur;
    std::string name, lane, cat;
  };
  std::vector<TE> steps, pcpu, pgpu, cops, kern, mem;
  for (const auto& e : p.ev) {
    if (!w.in_range(e.ts)) continue;  // the timeline shows the gaps between steps too
    switch (e.kind) {
      case Kind::Step: steps.push_back({e.ts, e.dur, e.name, "step", "step"}); break;
      case Kind::CpuAnn: pcpu.push_back({e.ts, e.dur, e.name.substr(5), "phase \u00b7 CPU", e.name.substr(5)}); break;
      case Kind::GpuAnn: pgpu.push_back({e.ts, e.dur, e.name.substr(5), "phase \u00b7 GPU", e.name.substr(5)}); break;
      case Kind::CpuOp:
        if (e.dur >= 20) cops.push_back({e.ts, e.dur, e.name, "CPU ops", "op"});
        break;
      case Kind::Kernel:
        if (e.dur >= 2) kern.push_back({e.ts, e.dur, e.name, "GPU kernels", kernel_category(e.name)});
        break;
      case Kind::Memcpy: mem.push_back({e.ts, e.dur, e.name, "GPU memcpy", "memcpy"}); break;
      case Kind::Memset: mem.push_back({e.ts, e.dur, e.name, "GPU memcpy", "memset"}); break;
      default: break;
    }
  }
  auto longest = [](std::vector<TE>& v, size_t cap) {
    if (v.size() <= cap) return;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(cap), v.end(),
                     [](const TE& a, const TE& b) { return a.dur > b.dur; });
    v.resize(cap);
  };
  longest(cops, 1500);
  longest(kern, 2500);
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  for (auto* v : {&steps, &pcpu, &pgpu, &cops, &kern, &mem})
    for (const auto& e : *v) {
      t0 = std::min(t0, e.ts);
      t1 = std::max(t1, e.ts + e.dur);
    }
  if (!std::isfinite(t0)) t0 = t1 = 0;
  json events = json::array();
  json lane_rows = json::object();
  for (auto* v : {&steps, &pcpu, &pgpu, &cops, &kern, &mem}) {
    std::sort(v->begin(), v->end(), [](const TE& a, const TE& b) { return a.ts < b.ts; });
    std::vector<double> row_end;
    std::string lane;
    for (const auto& e : *v) {
      lane = e.lane;
      const double t = round_to((e.ts - t0) / 1000.0, 3), d = round_to(e.dur / 1000.0, 4);
      size_t r = 0;
      while (r < row_end.size() && row_end[r] > t) ++r;
      const double end = t + std::max(d, 0.001);
      if (r == row_end.size()) row_end.push_back(end); else row_end[r] = end;
      events.push_back({{"name", e.name.substr(0, 64)}, {"t", t}, {"d", d}, {"lane", e.lane}, {"cat", e.cat}, {"row", r}});
    }
    if (!lane.empty()) lane_rows[lane] = row_end.size();
  }
  // Flows (CPU launch -> GPU kernel) by id.
  std::unordered_map<long long, double> fs;
  json flows = json::array();
  for (const auto& e : p.ev)
    if (e.kind == Kind::FlowS && w.in_range(e.ts)) fs[e.corr] = e.ts;
  for (const auto& e : p.ev) {
    if (flows.size() >= 4000) break;
    if (e.kind != Kind::FlowF) continue;
    auto it = fs.find(e.corr);
    if (it == fs.end()) continue;
    flows.push_back({round_to((it->second - t0) / 1000.0, 3), round_to((e.ts - t0) / 1000.0, 3)});
  }
  return {{"events", events}, {"flows", flows}, {"lane_rows", lane_rows}, {"total_ms", round_to((t1 - t0) / 1000.0, 3)}};
}

// ------------------------------------------------------------------ compare / what-if
namespace {
std::optional<double> num_field(const json& j, const char* k) {
  if (j.is_object() && j.contains(k) && j[k].is_number()) return j[k].get<double>();
  if (j.is_object() && j.contains("metrics") && j["metrics"].is_object() && j["metrics"].contains(k) &&
      j["metrics"][k].is_number())
    return j["metrics"][k].get<double>();
  return std::nullopt;
}
json field_or_null(const json& j, const char* k) {
  if (j.is_object() && j.contains(k)) return j[k];
  return nullptr;
}
}  // namespace

json compare_profiles(const json& a, const json& b, const std::string& an, const std::string& bn) {
  const auto ma = num_field(a, "img_per_s"), mb = num_field(b, "img_per_s");
  const auto sa = num_field(a, "img_per_s_std"), sb = num_field(b, "img_per_s_std");
  const auto na = num_field(a, "img_per_s_n"), nb = num_field(b, "img_per_s_n");
  json sig = nullptr;
  std::string reason;
  if (!ma || !mb) {
    reason = "img/s unavailable";
  } else if (sa && sb && na && nb && *na >= 2 && *nb >= 2) {
    const double se = std::sqrt((*sa) * (*sa) / *na + (*sb) * (*sb) / *nb);
    const double d = *mb - *ma;
    sig = std::fabs(d) > 2 * se;
    char buf[128];
    std::snprintf(buf, sizeof buf, "|d|=%.2f vs 2*SE=%.2f", std::fabs(d), 2 * se);
    reason = buf;
  } else {
    reason = "single run, use 'run --repeat N' for a significance call";
  }
  auto ms_per_image = [](const json& p) -> json {
    const auto s = num_field(p, "step_ms");
    json bs = p.contains("config") && p["config"].is_object() && p["config"].contains("batch") ? p["config"]["batch"]
                                                                                                 : json(nullptr);
    if (!s || !bs.is_number() || bs.get<double>() <= 0) return nullptr;
    return round_to(*s / bs.get<double>(), 3);
  };
  auto pair = [&](const char* k) { return json{{"before", field_or_null(a, k)}, {"after", field_or_null(b, k)}}; };
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json out;
  out["before"] = an;
  out["after"] = bn;
  out["img_per_s"] = {{"before", opt(ma)},
                      {"after", opt(mb)},
                      {"std", json::array({opt(sa), opt(sb)})},
                      {"n", json::array({opt(na), opt(nb)})},
                      {"significant", sig},
                      {"significance", reason}};
  out["ms_per_image"] = {{"before", ms_per_image(a)}, {"after", ms_per_image(b)}};
  out["gpu_util"] = pair("gpu_util");
  out["host_overhead_ms_per_step"] = pair("host_overhead_ms_per_step");
  out["launches_per_step"] = pair("launches_per_step");
  out["bound"] = pair("bound");
  return out;
}

json what_if(const json& p, const std::optional<std::string>& remove_category,
             const std::optional<long long>& remove_launches) {
  if (!remove_category && !remove_launches) throw UsageError("specify --remove-category or --remove-launches");
  const double step = num_field(p, "step_ms").value_or(0);
  double bs = 0;
  if (p.contains("config") && p["config"].is_object() && p["config"].contains("batch") &&
      p["config"]["batch"].is_number())
    bs = p["config"]["batch"].get<double>();
  const double host = num_field(p, "host_overhead_ms_per_step").value_or(0);
  double launches = num_field(p, "launches_per_step").value_or(0);
  if (launches <= 0) launches = 1;
  const double gpu = num_field(p, "gpu_busy_ms_per_step").value_or(0);
  const double util = num_field(p, "gpu_util").value_or(0);
  const double dataload = num_field(p, "dataload_ms").value_or(0);
  const double per_launch = host / launches;
  double removed_gpu = 0;
  long long removed_launches = remove_launches.value_or(0);
  if (remove_category) {
    const std::string want = lower(*remove_category);
    const json* hit = nullptr;
    std::string have;
    if (p.contains("categories") && p["categories"].is_array())
      for (const auto& c : p["categories"]) {
        const std::string name = c.value("name", "");
        have += (have.empty() ? "" : ", ") + name;
        if (!hit && lower(name).find(want) != std::string::npos) hit = &c;
      }
    if (!hit) throw UsageError("no category matching '" + *remove_category + "'. have: " + have);
    removed_gpu = hit->contains("ms_per_step") && (*hit)["ms_per_step"].is_number()
                      ? (*hit)["ms_per_step"].get<double>()
                      : (hit->contains("ms") && (*hit)["ms"].is_number() ? (*hit)["ms"].get<double>() : 0.0);
    if (gpu > 0) removed_launches += static_cast<long long>(launches * removed_gpu / gpu);
  }
  double projected;
  std::string mechanism;
  char buf[256];
  if (util < 0.8) {
    // Host-bound: every launch saved saves its host cost; the GPU work left (and the input
    // stall) is the floor.
    projected = std::max(step - removed_launches * per_launch, std::max(gpu - removed_gpu, 0.0) + dataload);
    std::snprintf(buf, sizeof buf, "host/launch-bound: ~%lld fewer launches x ~%.1fus host cost", removed_launches,
                  per_launch * 1000);
  } else {
    projected = std::max(step - removed_gpu, host);
    std::snprintf(buf, sizeof buf, "compute-bound: ~%.2f ms less GPU work", removed_gpu);
  }
  mechanism = buf;
  projected = std::max(projected, 0.0);
  auto ips = [&](double ms) -> json {
    if (bs <= 0 || ms <= 0) return nullptr;
    return round_to(bs / (ms / 1000.0), 2);
  };
  json out;
  out["trace"] = field_or_null(p, "trace");
  out["bound"] = field_or_null(p, "bound");
  out["mechanism"] = mechanism;
  out["removed"] = {{"gpu_ms", round_to(removed_gpu, 3)}, {"launches", removed_launches}};
  out["step_ms"] = {{"now", round_to(step, 2)}, {"projected", round_to(projected, 2)}};
  out["img_per_s"] = {{"now", ips(step)}, {"projected", ips(projected)}};
  out["caveat"] =
      "first-order estimate from per-step averages: it assumes the removed work's host cost scales with its "
      "launches and nothing else changes; measure the change to confirm";
  return out;
}

// ------------------------------------------------------------------ repeat
json aggregate_repeat(const std::vector<json>& profiles, const std::vector<std::string>& paths) {
  if (profiles.empty()) throw UsageError("no trials to aggregate");
  json out = profiles.back();
  if (!out.contains("metrics") || !out["metrics"].is_object()) out["metrics"] = json::object();
  std::vector<double> ips;
  for (const auto& p : profiles)
    if (auto v = num_field(p, "img_per_s")) ips.push_back(*v);
  if (!ips.empty()) {
    double mean = 0;
    for (double v : ips) mean += v;
    mean /= static_cast<double>(ips.size());
    double var = 0;
    for (double v : ips) var += (v - mean) * (v - mean);
    var /= static_cast<double>(ips.size());  // population std, as 1.6.0
    out["img_per_s"] = round_to(mean, 2);
    out["img_per_s_std"] = round_to(std::sqrt(var), 2);
  } else {
    out["img_per_s"] = nullptr;
    out["img_per_s_std"] = nullptr;
  }
  out["img_per_s_n"] = ips.size();
  out["img_per_s_trials"] = ips;
  for (const char* k : {"img_per_s", "img_per_s_std", "img_per_s_n", "img_per_s_trials"}) out["metrics"][k] = out[k];
  out["aggregation"] = {{"n", profiles.size()},
                        {"profiles", paths},
                        {"representative_profile", paths.empty() ? json(nullptr) : json(paths.back())},
                        {"note", "scalar metrics are averaged; kernel lists and trace view use the final trial."}};
  static const std::map<std::string, std::string> alias = {{"gpu_busy_ms_per_step", "gpu_busy_ms"},
                                                           {"memcpy_ms_per_step", "memcpy_ms"},
                                                           {"host_overhead_ms_per_step", "host_overhead_ms"}};
  for (const char* k : {"step_ms", "gpu_util", "gpu_util_raw", "gpu_busy_ms_per_step", "mean_kernel_us",
                        "kernels_per_step", "memcpy_ms_per_step", "host_overhead_ms_per_step", "launches_per_step",
                        "dataload_ms", "dataload_frac", "tensorcore_pct", "cuda_mallocs_per_step"}) {
    double sum = 0;
    size_t n = 0;
    bool all_int = true;
    for (const auto& p : profiles)
      if (p.contains(k) && p[k].is_number()) {
        sum += p[k].get<double>();
        all_int = all_int && p[k].is_number_integer();
        ++n;
      }
    if (n == 0) continue;
    const double mean = sum / static_cast<double>(n);
    json v = all_int && std::fabs(mean - std::round(mean)) < 1e-9 ? json(static_cast<long long>(std::llround(mean)))
                                                                   : json(round_to(mean, 3));
    out[k] = v;
    auto a = alias.find(k);
    const std::string mk = a != alias.end() ? a->second : std::string(k);
    if (out["metrics"].contains(mk) || a != alias.end()) out["metrics"][mk] = v;
  }
  std::set<std::string> bounds;
  for (const auto& p : profiles)
    if (p.contains("bound") && p["bound"].is_string()) bounds.insert(p["bound"].get<std::string>());
  if (bounds.size() > 1) {
    out["bound"] = "mixed";
    out["bound_why"] = "repeat trials produced mixed bottleneck verdicts";
    out["metrics"]["bound"] = "mixed";
  }
  return out;
}

// ------------------------------------------------------------------ loading
json load_profile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) || fs::is_directory(path, ec)) throw UsageError("not found: " + path);
  json j;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the file");
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw RuntimeError("failed to analyse " + path + ": " + e.what(), "", "profile_analysis_failed");
  }
  if (j.is_object() && j.contains("schema") && j["schema"].is_string() &&
      j["schema"].get<std::string>().rfind("libreyolo.profile.analysis", 0) == 0)
    return j;
  try {
    json summary;
    const json* sp = nullptr;
    const fs::path sib = fs::path(path).parent_path() / "profile_summary.json";
    if (fs::exists(sib, ec)) {
      std::ifstream in(sib, std::ios::binary);
      summary = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (summary.is_object()) sp = &summary;
    }
    return analyze_trace(j, sp, path);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw RuntimeError("failed to analyse " + path + ": " + e.what(), "", "profile_analysis_failed");
  }
}

}  // namespace libreyolo::profile
