// Kernel names sorted into categories and labels, and the verdict of a profile: what bounds the
// step (host, GPU compute, memory, data) and the lever for it.
#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "core/strings.hpp"
#include "profile/analysis.hpp"

namespace libreyolo::profile {

using libreyolo::lower;

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

}  // namespace libreyolo::profile
