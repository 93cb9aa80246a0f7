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

// ------------------------------------------------------------------ trace parsing
namespace {

bool contains(const std::string& s, const char* sub) { return s.find(sub) != std::string::npos; }

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

// Rows of `agg`, most time first, at most `limit`: row(name, aggregate, share of the total in %).
template <class Row>
json ranked_rows(const std::map<std::string, KAgg>& agg, size_t limit, Row row) {
  double total = 0;
  for (const auto& [k, a] : agg) total += a.us;
  std::vector<std::pair<std::string, KAgg>> rows(agg.begin(), agg.end());
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  json out = json::array();
  for (const auto& [name, a] : rows) {
    if (out.size() >= limit) break;
    out.push_back(row(name, a, round_to(total > 0 ? a.us / total * 100 : 0, 2)));
  }
  return out;
}

json krows(const std::map<std::string, KAgg>& agg, int n_real, size_t limit) {
  return ranked_rows(agg, limit, [&](const std::string& name, const KAgg& a, double pct) {
    return json{{"kernel", kernel_label(name)},
                {"raw_name", name.substr(0, 90)},
                {"category", kernel_category(name)},
                {"tensorcore", is_tensorcore(name)},
                {"ms_per_step", round_to(a.us / 1000.0 / n_real, 4)},
                {"pct_of_gpu", pct},
                {"count_per_step", std::max<long long>(a.count / n_real, 1)}};
  });
}

json orows(const std::map<std::string, KAgg>& agg, int n_real, size_t limit) {
  return ranked_rows(agg, limit, [&](const std::string& name, const KAgg& a, double pct) {
    return json{{"op", name.substr(0, 70)},
                {"ms_per_step", round_to(a.us / 1000.0 / n_real, 4)},
                {"pct_of_cpu_ops", pct},
                {"count_per_step", std::max<long long>(a.count / n_real, 1)}};
  });
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
  json metrics = {{"ops_per_step", ops_ps}};
  for (const char* k : {"img_per_s", "step_ms", "dataload_ms", "dataload_frac", "gpu_util", "mean_kernel_us",
                        "kernels_per_step", "unique_kernels", "tensorcore_pct", "peak_vram_mb", "launches_per_step",
                        "cuda_mallocs_per_step", "memory_pressure", "bound"})
    metrics[k] = out[k];
  for (const char* k : {"gpu_busy_ms", "memcpy_ms", "host_overhead_ms"}) metrics[k] = out[std::string(k) + "_per_step"];
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

}  // namespace libreyolo::profile
