#include "profile/profile_cli.hpp"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <optional>
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "core/error_report.hpp"

#include "profile/analysis.hpp"
#include "core/options.hpp"
#include "core/strings.hpp"

namespace libreyolo::profile {

using libreyolo::lower;

namespace {

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// --------------------------------------------------------------- arguments
struct Spec {
  std::set<std::string> values;  // options that take a value
  std::set<std::string> flags;   // boolean options
  size_t min_pos = 0, max_pos = 0;
  const char* usage = "";
};

struct Args {
  std::map<std::string, std::string> opt;
  std::set<std::string> flag;
  std::vector<std::string> pos;
  bool json = false;
  bool help = false;
};

Args parse(const std::vector<std::string>& a, const Spec& spec, const std::string& sub) {
  Args out;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string& w = a[i];
    if (w == "--json") {
      out.json = true;
    } else if (w == "--help" || w == "-h") {
      out.help = true;
    } else if (w.size() > 2 && w.compare(0, 2, "--") == 0) {
      std::string name = w.substr(2), value;
      bool has_value = false;
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (spec.flags.count(name)) {
        if (has_value) throw UsageError("option --" + name + " takes no value", spec.usage, "config_type_error");
        out.flag.insert(name);
      } else if (spec.values.count(name)) {
        if (!has_value) {
          if (i + 1 >= a.size()) throw UsageError("option --" + name + " requires a value", spec.usage);
          value = a[++i];
        }
        out.opt[name] = value;
      } else {
        throw UsageError("no such option: --" + name + " (profile " + sub + ")", spec.usage, "config_unknown_key");
      }
    } else {
      out.pos.push_back(w);
    }
  }
  if (!out.help && (out.pos.size() < spec.min_pos || out.pos.size() > spec.max_pos))
    throw UsageError(out.pos.size() < spec.min_pos ? "missing argument" : "unexpected argument '" + out.pos.back() + "'",
                     spec.usage);
  return out;
}

long long int_opt(const Args& a, const std::string& k, long long def) {
  auto it = a.opt.find(k);
  if (it == a.opt.end()) return def;
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw UsageError("--" + k + " expects an integer, got '" + it->second + "'");
  }
}

std::string str_opt(const Args& a, const std::string& k, const std::string& def = "") {
  auto it = a.opt.find(k);
  return it == a.opt.end() ? def : it->second;
}

// --------------------------------------------------------------- helpers
std::string jstr(const json& v, int digits = -1) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float() && digits >= 0) return fmt("%.*f", digits, v.get<double>());
  return v.dump();
}

double jd(const json& p, const char* k, double def = 0) {
  if (p.contains(k) && p[k].is_number()) return p[k].get<double>();
  return def;
}

const json& arr(const json& p, const char* k) {
  static const json empty = json::array();
  if (p.contains(k) && p[k].is_array()) return p[k];
  return empty;
}

std::string bar(double pct) {
  int n = static_cast<int>(std::lround(std::clamp(pct, 0.0, 100.0) / 5.0));
  return std::string(static_cast<size_t>(n), '#') + std::string(static_cast<size_t>(20 - n), '.');
}


std::vector<std::string> phase_names(const json& p, const char* by) {
  std::vector<std::string> names;
  if (p.contains(by) && p[by].is_object())
    for (auto it = p[by].begin(); it != p[by].end(); ++it) names.push_back(it.key());
  return names;
}

const json& phase_rows(const json& p, const char* by, const std::string& phase) {
  if (!p.contains(by) || !p[by].is_object() || !p[by].contains(phase)) {
    std::string have;
    for (const auto& n : phase_names(p, by)) have += (have.empty() ? "" : ", ") + n;
    throw UsageError("unknown phase '" + phase + "'. available: " + (have.empty() ? "(none)" : have));
  }
  return p[by][phase];
}

// --------------------------------------------------------------- subcommands
int cmd_summary(const json& p, const Args& a, std::ostream& out) {
  static const char* keep[] = {"trace", "mode", "model", "config", "bound", "bound_why", "step_ms", "img_per_s",
                               "latency", "stages_ms", "gpu_util", "gpu_busy_ms_per_step", "mean_kernel_us",
                               "kernels_per_step", "unique_kernels", "memcpy_ms_per_step", "tensorcore_pct",
                               "peak_vram_mb", "dataload_ms", "dataload_frac", "host_overhead_ms_per_step",
                               "launches_per_step", "memory_pressure", "cuda_mallocs_per_step", "gpu_util_raw",
                               "window", "categories", "phases_gpu", "top_kernels", "lever", "busy_source"};
  if (a.json) {
    json j = json::object();
    for (const char* k : keep)
      if (p.contains(k)) j[k] = p[k];
    out << j.dump(2) << "\n";
    return 0;
  }
  const json cfg = p.contains("config") && p["config"].is_object() ? p["config"] : json::object();
  const bool cpu = p.value("busy_source", std::string("")) == "cpu_ops";
  out << jstr(p.value("model", json(nullptr))) << "  \u00b7  " << jstr(p.value("bound", json(nullptr)));
  if (cfg.contains("batch")) out << "  \u00b7  batch " << jstr(cfg["batch"]);
  if (cfg.contains("imgsz")) out << " \u00b7 imgsz " << jstr(cfg["imgsz"]);
  if (cfg.contains("device")) out << " \u00b7 " << jstr(cfg["device"]);
  out << "\n";
  out << fmt("step %s ms  \u00b7  %s img/s", jstr(p.value("step_ms", json(nullptr)), 2).c_str(),
             jstr(p.value("img_per_s", json(nullptr)), 2).c_str());
  if (p.value("mode", std::string("")) == "inference") {
    if (p.contains("latency")) out << "  \u00b7  latency " << p["latency"].dump();
    if (p.contains("stages_ms")) out << "  \u00b7  stages " << p["stages_ms"].dump();
  }
  out << "\n";
  if (cpu)
    out << fmt("CPU: ops busy %.0f%% (%.2f ms/step, union of ops)\n", jd(p, "gpu_util") * 100,
               jd(p, "gpu_busy_ms_per_step"));
  else
    out << fmt("GPU: util %.0f%% (busy %.2f ms/step) \u00b7 %.0f kernels/step @ %.2f us \u00b7 TC %.1f%% \u00b7 memcpy "
               "%.3f ms \u00b7 peak VRAM %s MB\n",
               jd(p, "gpu_util") * 100, jd(p, "gpu_busy_ms_per_step"), jd(p, "kernels_per_step"),
               jd(p, "mean_kernel_us"), jd(p, "tensorcore_pct"), jd(p, "memcpy_ms_per_step"),
               jstr(p.value("peak_vram_mb", json(nullptr)), 1).c_str());
  out << fmt("host: overhead %.2f ms/step \u00b7 %.0f launches/step \u00b7 dataload %s ms (%s)\n",
             jd(p, "host_overhead_ms_per_step"), jd(p, "launches_per_step"),
             jstr(p.value("dataload_ms", json(nullptr)), 3).c_str(),
             p.contains("dataload_frac") && p["dataload_frac"].is_number()
                 ? fmt("%.1f%%", p["dataload_frac"].get<double>() * 100).c_str()
                 : "-");
  if (p.value("memory_pressure", false))
    out << fmt("** MEMORY-PRESSURE: ~%.0f cudaMalloc/free per step; throughput and utilisation are unreliable **\n",
               jd(p, "cuda_mallocs_per_step"));
  out << ">> " << bound_label(p.value("bound", std::string("?"))) << ": " << p.value("bound_why", std::string(""))
      << "\n";
  const std::string lever = p.contains("lever") && p["lever"].is_string()
                                ? p["lever"].get<std::string>()
                                : bound_lever(p.value("bound", std::string("")), cpu);
  if (!lever.empty()) out << "   levers: " << lever << "\n";
  if (!arr(p, "categories").empty()) {
    out << "kernel mix:\n";
    for (const auto& c : arr(p, "categories"))
      out << fmt("  %-18s %s %5.1f%%  %.3f ms\n", c.value("name", std::string("")).c_str(), bar(jd(c, "pct")).c_str(),
                 jd(c, "pct"), jd(c, "ms_per_step", jd(c, "ms")));
  }
  if (!arr(p, "top_kernels").empty()) {
    out << "top kernels / step:\n";
    for (const auto& k : arr(p, "top_kernels"))
      out << fmt("  %9.3f ms %6.2f%%  x%-5s %s%s\n", jd(k, "ms_per_step"), jd(k, "pct_of_gpu"),
                 jstr(k.value("count_per_step", json(nullptr))).c_str(), k.value("kernel", std::string("")).c_str(),
                 k.value("tensorcore", false) ? " [TC]" : "");
  }
  return 0;
}

int cmd_get(const json& p, const Args& a, std::ostream& out) {
  const json metrics = p.contains("metrics") && p["metrics"].is_object() ? p["metrics"] : json::object();
  if (a.pos.size() < 3) {
    std::vector<std::string> keys;
    for (auto it = metrics.begin(); it != metrics.end(); ++it) keys.push_back(it.key());
    std::sort(keys.begin(), keys.end());
    if (a.json) {
      out << json(keys).dump() << "\n";
    } else {
      for (const auto& k : keys) out << k << "\n";
    }
    return 0;
  }
  const std::string field = a.pos[2];
  json v;
  if (metrics.contains(field))
    v = metrics[field];
  else if (p.contains(field) && !p[field].is_object() && !p[field].is_array())
    v = p[field];
  else
    throw UsageError("unknown metric '" + field + "'. run 'profile get <file>' to list metrics.");
  if (a.json)
    out << json{{field, v}}.dump() << "\n";
  else
    out << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  return 0;
}

int cmd_phases(const json& p, const Args& a, std::ostream& out) {
  if (a.json) {
    out << json{{"trace", p.value("trace", json(nullptr))}, {"phases", arr(p, "phases")}}.dump(2) << "\n";
    return 0;
  }
  out << fmt("%-12s %10s %10s %9s %9s\n", "phase", "gpu_ms", "wall_ms", "kernels", "ops");
  for (const auto& r : arr(p, "phases"))
    out << fmt("%-12s %10.3f %10s %9s %9s\n", r.value("phase", std::string("")).c_str(), jd(r, "gpu_ms_per_step"),
               jstr(r.value("wall_ms_per_step", json(nullptr)), 2).c_str(),
               jstr(r.value("kernels_per_step", json(nullptr))).c_str(), jstr(r.value("ops_per_step", json(nullptr))).c_str());
  return 0;
}

int cmd_kernels(const json& p, const Args& a, std::ostream& out) {
  const long long top = int_opt(a, "top", 20);
  const std::string phase = str_opt(a, "phase");
  const json& rows = phase.empty() ? arr(p, "kernels") : phase_rows(p, "kernels_by_phase", phase);
  const std::string cat = lower(str_opt(a, "category"));
  std::optional<std::regex> re;
  if (a.opt.count("grep")) {
    try {
      re.emplace(a.opt.at("grep"), std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      throw UsageError("--grep: invalid regular expression '" + a.opt.at("grep") + "': " + e.what());
    }
  }
  const bool tc_only = a.flag.count("tensorcore") > 0;
  std::vector<json> sel;
  for (const auto& k : rows) {
    if (!cat.empty() && lower(k.value("category", std::string(""))).find(cat) == std::string::npos) continue;
    if (re && !std::regex_search(k.value("raw_name", std::string("")), *re) &&
        !std::regex_search(k.value("kernel", std::string("")), *re))
      continue;
    if (tc_only && !k.value("tensorcore", false)) continue;
    sel.push_back(k);
  }
  const std::string sort = str_opt(a, "sort", "time");
  if (sort == "count")
    std::stable_sort(sel.begin(), sel.end(),
                     [](const json& x, const json& y) { return jd(x, "count_per_step") > jd(y, "count_per_step"); });
  else if (sort == "name")
    std::stable_sort(sel.begin(), sel.end(), [](const json& x, const json& y) {
      return x.value("kernel", std::string("")) < y.value("kernel", std::string(""));
    });
  else
    std::stable_sort(sel.begin(), sel.end(),
                     [](const json& x, const json& y) { return jd(x, "ms_per_step") > jd(y, "ms_per_step"); });
  const size_t matched = sel.size();
  if (top >= 0 && sel.size() > static_cast<size_t>(top)) sel.resize(static_cast<size_t>(top));
  if (a.json) {
    out << json{{"trace", p.value("trace", json(nullptr))}, {"matched", matched}, {"kernels", sel}}.dump(2) << "\n";
    return 0;
  }
  out << fmt("%zu kernels matched%s\n", matched, phase.empty() ? "" : (" in phase " + phase).c_str());
  out << fmt("%10s %7s %7s %3s  %-17s %s\n", "ms/step", "%gpu", "count", "TC", "category", "kernel");
  for (const auto& k : sel)
    out << fmt("%10.4f %7.2f %7s %3s  %-17s %s\n", jd(k, "ms_per_step"), jd(k, "pct_of_gpu"),
               jstr(k.value("count_per_step", json(nullptr))).c_str(), k.value("tensorcore", false) ? "TC" : "",
               k.value("category", std::string("")).c_str(), k.value("raw_name", std::string("")).c_str());
  return 0;
}

int cmd_ops(const json& p, const Args& a, std::ostream& out) {
  const long long top = int_opt(a, "top", 20);
  const std::string phase = str_opt(a, "phase");
  const json& rows = phase.empty() ? arr(p, "ops") : phase_rows(p, "ops_by_phase", phase);
  std::vector<json> sel(rows.begin(), rows.end());
  if (top >= 0 && sel.size() > static_cast<size_t>(top)) sel.resize(static_cast<size_t>(top));
  if (a.json) {
    out << json{{"trace", p.value("trace", json(nullptr))}, {"ops", sel}}.dump(2) << "\n";
    return 0;
  }
  out << fmt("%10s %7s %7s  %s\n", "ms/step", "%cpu", "count", "op");
  for (const auto& o : sel)
    out << fmt("%10.4f %7.2f %7s  %s\n", jd(o, "ms_per_step"), jd(o, "pct_of_cpu_ops"),
               jstr(o.value("count_per_step", json(nullptr))).c_str(), o.value("op", std::string("")).c_str());
  return 0;
}

int cmd_compare(const json& b, const json& af, const Args& a, std::ostream& out) {
  const json c = compare_profiles(b, af, a.pos[1], a.pos[2]);
  if (a.json) {
    out << c.dump(2) << "\n";
    return 0;
  }
  const json& ips = c["img_per_s"];
  std::string tag;
  if (ips["significant"].is_boolean())
    tag = ips["significant"].get<bool>() ? "[significant]" : "[NOT significant]";
  else
    tag = "[" + ips["significance"].get<std::string>() + "]";
  std::string change;
  if (ips["before"].is_number() && ips["after"].is_number() && ips["before"].get<double>() > 0)
    change = fmt(" (%+.1f%%)", (ips["after"].get<double>() / ips["before"].get<double>() - 1) * 100);
  out << "img/s:        " << jstr(ips["before"], 2) << " -> " << jstr(ips["after"], 2) << change << "  " << tag;
  if (ips["significant"].is_boolean()) out << "  " << ips["significance"].get<std::string>();
  out << "\n";
  auto line = [&](const char* label, const char* key, int digits) {
    out << label << jstr(c[key]["before"], digits) << " -> " << jstr(c[key]["after"], digits) << "\n";
  };
  line("ms/image:     ", "ms_per_image", 3);
  line("GPU util:     ", "gpu_util", 3);
  line("host ms/step: ", "host_overhead_ms_per_step", 2);
  line("launches:     ", "launches_per_step", 0);
  line("verdict:      ", "bound", -1);
  return 0;
}

int cmd_what_if(const json& p, const Args& a, std::ostream& out) {
  std::optional<std::string> cat;
  std::optional<long long> launches;
  if (a.opt.count("remove-category")) cat = a.opt.at("remove-category");
  if (a.opt.count("remove-launches")) {
    launches = int_opt(a, "remove-launches", 0);
    if (*launches < 0) throw UsageError("--remove-launches must be >= 0");
  }
  const json w = what_if(p, cat, launches);
  if (a.json) {
    out << w.dump(2) << "\n";
    return 0;
  }
  out << "verdict now:  " << jstr(w["bound"]) << "\n";
  out << "mechanism:    " << w["mechanism"].get<std::string>() << "\n";
  out << "removed:      " << jstr(w["removed"]["gpu_ms"], 3) << " ms GPU work, " << jstr(w["removed"]["launches"])
      << " launches per step\n";
  out << "step ms:      " << jstr(w["step_ms"]["now"], 2) << " -> " << jstr(w["step_ms"]["projected"], 2) << "\n";
  out << "img/s:        " << jstr(w["img_per_s"]["now"], 2) << " -> " << jstr(w["img_per_s"]["projected"], 2) << "\n";
  out << "caveat:       " << w["caveat"].get<std::string>() << "\n";
  return 0;
}

const char* kUsage =
    "Usage: libreyolo profile <subcommand> [args] [--json]\n"
    "\n"
    "  run <data>            profile a training window: --weights --size --batch --imgsz --workers\n"
    "                        --amp/--no-amp --amp-dtype D --cuda-graph --steps --warmup --repeat --device --project --json\n"
    "  infer [source]        profile inference: --weights --size --batch --imgsz --half/--no-half --amp-dtype D\n"
    "                        --warmup --runs --repeat --conf --iou --max-det --device --trace/--no-trace\n"
    "                        --cuda-graph [false|true|auto] --project --json\n"
    "  summary <file>        headline, verdict, kernel mix and top kernels\n"
    "  get <file> [field]    list the metrics, or print one\n"
    "  phases <file>         GPU and wall time per phase\n"
    "  kernels <file>        --top 20 --category S --grep RE --tensorcore --sort time|count|name --phase P\n"
    "  ops <file>            --top 20 --phase P\n"
    "  compare <before> <after>   img/s change (significance needs run --repeat >= 2 on both sides)\n"
    "  what-if <file>        --remove-category S | --remove-launches N\n"
    "\n"
    "<file> is a profile.json (or *_repeat.json), or a raw Kineto trace (its sibling\n"
    "profile_summary.json is used when present). Exit codes: 2 bad file or arguments,\n"
    "3 no profile produced, 1 a trace that cannot be analysed.\n";


}  // namespace

int run_profile_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const bool json_out = std::find(args.begin(), args.end(), "--json") != args.end();
  if (args.empty()) {
    err << kUsage;
    return 2;
  }
  const std::string sub = args[0];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    out << kUsage;
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (sub == "run" || sub == "infer") {
      if (std::find(rest.begin(), rest.end(), "--help") != rest.end()) {
        out << kUsage;
        return 0;
      }
      // `run` and `infer` are dispatched by the CLI before they reach the readers
      // (cli/profile_run.cpp); this library entry point only has the readers.
      throw UsageError("'libreyolo profile " + sub + "' runs a model: use the libreyolo command", "",
                       "not_implemented");
    }
    Spec spec;
    spec.usage = kUsage;
    spec.min_pos = spec.max_pos = 1;
    if (sub == "summary" || sub == "phases") {
    } else if (sub == "get") {
      spec.max_pos = 2;
    } else if (sub == "kernels") {
      spec.values = {"top", "category", "grep", "sort", "phase"};
      spec.flags = {"tensorcore"};
    } else if (sub == "ops") {
      spec.values = {"top", "phase"};
    } else if (sub == "compare") {
      spec.min_pos = spec.max_pos = 2;
    } else if (sub == "what-if") {
      spec.values = {"remove-category", "remove-launches"};
    } else {
      const std::string near =
          closest_match(sub, {"run", "infer", "summary", "get", "phases", "kernels", "ops", "compare", "what-if"});
      throw UsageError("no such profile subcommand '" + sub + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?"),
                       kUsage, "config_unknown_key");
    }
    Args a = parse(rest, spec, sub);
    if (a.help) {
      out << kUsage;
      return 0;
    }
    a.pos.insert(a.pos.begin(), sub);  // pos[1] is the first file
    if (sub == "what-if" && !a.opt.count("remove-category") && !a.opt.count("remove-launches"))
      throw UsageError("specify --remove-category or --remove-launches");
    const json p = load_profile(a.pos[1]);
    // A profile whose fields have other types than this build writes (edited by hand, another
    // program's JSON) fails inside a command: said as a data error naming the file(s), not as
    // the JSON library's text.
    const std::string files = a.pos.size() > 2 && sub == "compare" ? a.pos[1] + " or " + a.pos[2] : a.pos[1];
    try {
      // Written out only when the command gets through: no partial report before an error.
      std::ostringstream report;
      const int rc = [&] {
        if (sub == "summary") return cmd_summary(p, a, report);
        if (sub == "get") return cmd_get(p, a, report);
        if (sub == "phases") return cmd_phases(p, a, report);
        if (sub == "kernels") return cmd_kernels(p, a, report);
        if (sub == "ops") return cmd_ops(p, a, report);
        if (sub == "what-if") return cmd_what_if(p, a, report);
        const json after = load_profile(a.pos[2]);
        return cmd_compare(p, after, a, report);
      }();
      out << report.str();
      return rc;
    } catch (const json::exception& e) {
      std::string what = e.what();
      if (const size_t cut = what.find("] "); what.rfind("[json.exception", 0) == 0 && cut != std::string::npos)
        what = what.substr(cut + 2);
      throw UsageError(files + " is not a profile this build reads: " + what,
                       "Profiles are written by `libreyolo profile run|infer` or train profile=true.",
                       "profile_invalid");
    }
  } catch (const Error& e) {
    report_error(e, json_out, out, err);
    return e.exit_code();
  } catch (const std::exception& e) {
    RuntimeError re(e.what());
    report_error(re, json_out, out, err);
    return 1;
  }
}

}  // namespace libreyolo::profile
