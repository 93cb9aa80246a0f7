// The profiler's trace analysis, verdict rules, categoriser, compare / what-if arithmetic, the
// `libreyolo profile` readers, and timeline.html in a real headless browser, on synthetic traces
// (the Window with real torch ops is test_profile_window.cpp). Temporary directories come from
// support's temp_dir: std::filesystem::remove_all must not be called (libtorch.so's copy wins).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "profile/analysis.hpp"
#include "profile/infer.hpp"
#include "profile/profile_cli.hpp"
#include "profile/timeline.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
namespace lp = libreyolo::profile;

namespace {

std::string scratch(const std::string& tag) { return libreyolo::test::temp_dir("prof_" + tag); }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

int sh(const std::string& cmd, std::string* output) { return libreyolo::test::run_command(cmd, output); }

json X(const std::string& cat, const std::string& name, double ts, double dur, long long tid = 1,
       long long corr = -1) {
  json e = {{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 1}, {"tid", tid}, {"ts", ts}, {"dur", dur}};
  if (corr >= 0) e["args"] = {{"correlation", corr}};
  return e;
}

const char* kHopperConv =
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cudnn";
const char* kElementwise = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>";

// Ten 1 ms steps. In each: forward [0,400) us, loss [400,450), backward [450,900) on the CPU; two
// kernels on two streams overlapping by 200 us: a conv launched in forward (GPU 100-500) and an
// elementwise kernel launched in loss (GPU 300-700, i.e. its GPU start lies in forward).
json synthetic_trace(int mallocs_per_step = 0, bool gpu_marker_copies = false) {
  json ev = json::array();
  for (int i = 0; i < 10; ++i) {
    const double t = 10000 + i * 1000.0;
    ev.push_back(X("user_annotation", "ProfilerStep#" + std::to_string(i), t, 1000));
    if (gpu_marker_copies) ev.push_back(X("gpu_user_annotation", "ProfilerStep#" + std::to_string(i), t + 5, 990, 7));
    ev.push_back(X("user_annotation", "step/forward", t, 400));
    ev.push_back(X("user_annotation", "step/loss", t + 400, 50));
    ev.push_back(X("user_annotation", "step/backward", t + 450, 450));
    ev.push_back(X("cpu_op", "aten::conv2d", t + 20, 100));
    ev.push_back(X("cpu_op", "aten::mse_loss", t + 405, 30));
    ev.push_back(X("cuda_runtime", "cudaLaunchKernel", t + 50, 5, 1, 2 * i));
    ev.push_back(X("cuda_runtime", "cudaLaunchKernel", t + 420, 5, 1, 2 * i + 1));
    ev.push_back(X("kernel", kHopperConv, t + 100, 400, 7, 2 * i));
    ev.push_back(X("kernel", kElementwise, t + 300, 400, 8, 2 * i + 1));
    ev.push_back(X("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t + 5, 20, 7));
    for (int k = 0; k < mallocs_per_step; ++k) ev.push_back(X("cuda_runtime", "cudaMalloc", t + 600 + k, 1));
    json s = {{"ph", "s"}, {"cat", "ac2g"}, {"id", 2 * i}, {"pid", 1}, {"tid", 1}, {"ts", t + 50}, {"name", "ac2g"}};
    json f = {{"ph", "f"}, {"cat", "ac2g"}, {"id", 2 * i}, {"pid", 1}, {"tid", 7}, {"ts", t + 100}, {"name", "ac2g"}};
    ev.push_back(s);
    ev.push_back(f);
  }
  return {{"traceEvents", ev}};
}

json synthetic_summary(double dataload_frac = 0.01) {
  return {{"meta",
           {{"model", "YOLOv9-t"},
            {"device", "cuda:0"},
            {"batch", 16},
            {"imgsz", 640},
            {"amp", true},
            {"amp_dtype", "bfloat16"},
            {"workers", 8}}},
          {"window", {{"warmup", 5}, {"real_steps", 6}, {"synced_steps", 4}}},
          {"real",
           {{"step_ms", 1.0},
            {"dataload_ms", dataload_frac},
            {"compute_ms", 1.0 - dataload_frac},
            {"img_per_s", 16000.0},
            {"dataload_frac", dataload_frac}}},
          {"composition_ms", {{"to_device", 0.01}, {"forward", 0.4}, {"loss", 0.05}, {"backward", 0.45}, {"optimizer", 0.0}}},
          {"composition_total_ms", 0.91},
          {"bound", "compute"},
          {"bound_why", ""},
          {"trace", "profile_trace.json"}};
}

std::optional<std::string> example_profile() {
  std::vector<std::string> c;
  if (const char* e = std::getenv("LIBREYOLO_PROFILE_EXAMPLE")) c.emplace_back(e);
  c.emplace_back(std::string(LIBREYOLO_SOURCE_DIR) + "/../shared/reference/profile_example/profile.json");
  if (const char* f = std::getenv("LIBREYOLO_FIXTURES")) c.emplace_back(std::string(f) + "/../reference/profile_example/profile.json");
  for (const auto& p : c)
    if (fs::exists(p)) return p;
  return std::nullopt;
}

int cli(std::vector<std::string> args, std::string* out_s = nullptr, std::string* err_s = nullptr) {
  std::ostringstream out, err;
  const int rc = lp::run_profile_command(args, out, err);
  if (out_s) *out_s = out.str();
  if (err_s) *err_s = err.str();
  return rc;
}

}  // namespace

// ------------------------------------------------------------------ categoriser
TEST(ProfileCategorise, HopperNamesAreGemmConvAndTensorCore) {
  // Names as they appear in the H200 example profile (LibreYOLO 1.6.0 filed nvjet as "other"
  // and none of these as tensor-core work).
  for (const char* n : {"nvjet_sm90_tst_192x32_64x7_4x1_v_ssched_bz_NTT", "nvjet_sm90_tss_64x8_64x16_1x2_h_bz_TNT",
                        kHopperConv,
                        "sm90_xmma_wgrad_indexed_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_",
                        "sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x64x32_warpgro",
                        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22"}) {
    EXPECT_EQ(lp::kernel_category(n), "gemm / conv") << n;
    EXPECT_TRUE(lp::is_tensorcore(n)) << n;
  }
  EXPECT_TRUE(lp::is_tensorcore("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64"));
  // Plain fp32 xmma runs on the FMA pipes; tf32 does not.
  EXPECT_FALSE(lp::is_tensorcore("sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3"));
  EXPECT_TRUE(lp::is_tensorcore("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32"));
}

TEST(ProfileCategorise, ReferenceRulesKeepTheirOrder) {
  EXPECT_EQ(lp::kernel_category("void at::native::batch_norm_backward_kernel<c10::BFloat16, float, float, int>"),
            "reduction / norm");
  EXPECT_EQ(lp::kernel_category("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>"), "reduction / norm");  // before cudnn
  EXPECT_EQ(lp::kernel_category("void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16>"), "layout / copy");
  EXPECT_EQ(lp::kernel_category("void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<>"),
            "layout / copy");
  EXPECT_EQ(lp::kernel_category(kElementwise), "elementwise");
  EXPECT_EQ(lp::kernel_category("void at::native::reduce_kernel<512, 1>"), "reduction / norm");
  EXPECT_EQ(lp::kernel_category("void at::native::mbtopk::computeBlockDigitCounts<float>"), "other");
  EXPECT_FALSE(lp::is_tensorcore(kElementwise));
  EXPECT_EQ(lp::kernel_label("void cudnn::bn_bw_1C11_kernel_new<float>"), "cudnn batchnorm (bwd)");
  EXPECT_EQ(lp::kernel_label("void at::native::(anonymous namespace)::CatArrayBatchedCopy<>"), "concat");
  EXPECT_EQ(lp::kernel_label("nvjet_sm90_tst_192x32_64x7_4x1_v_ssched_bz_NTT"), "nvjet_sm90_tst_192x32_64x7_4x1_v_ssched_");
}

// ------------------------------------------------------------------ utilisation
TEST(ProfileUnion, OverlappingIntervalsCountOnce) {
  EXPECT_DOUBLE_EQ(lp::union_length({}), 0.0);
  EXPECT_DOUBLE_EQ(lp::union_length({{0, 10}, {5, 15}, {20, 30}}), 25.0);
  EXPECT_DOUBLE_EQ(lp::union_length({{20, 30}, {0, 100}, {40, 50}}), 100.0);  // nested, unsorted
  EXPECT_DOUBLE_EQ(lp::union_length({{0, 10}, {10, 20}}), 20.0);              // touching
}

// ------------------------------------------------------------------ verdict
TEST(ProfileVerdict, FirstMatchingRuleWins) {
  lp::VerdictInputs in;
  in.util = 0.3;
  in.dataload_frac = 0.05;
  in.kernels_per_step = 7298;
  in.mean_kernel_us = 12.6;
  auto v = lp::decide(in);
  EXPECT_EQ(v.bound, "host / launch");
  EXPECT_NE(v.why.find("7298 kernels/step"), std::string::npos) << v.why;
  in.util = 0.85;
  EXPECT_EQ(lp::decide(in).bound, "compute");
  in.dataload_frac = 0.25;  // input waits while the GPU is saturated overlap its work: compute
  v = lp::decide(in);
  EXPECT_EQ(v.bound, "compute");
  EXPECT_NE(v.why.find("input waits (~25% of the step) overlap"), std::string::npos) << v.why;
  in.util = 0.6;  // the GPU idles meanwhile: dataloader beats host / launch
  v = lp::decide(in);
  EXPECT_EQ(v.bound, "dataloader");
  EXPECT_NE(v.why.find("25%"), std::string::npos) << v.why;
  in.cuda_mallocs_per_step = 5;  // memory pressure beats everything
  EXPECT_EQ(lp::decide(in).bound, "memory-pressure");
  in.cuda_mallocs_per_step = 0;
  in.util = 1.2;
  v = lp::decide(in);
  EXPECT_EQ(v.bound, "memory-pressure");
  EXPECT_NE(v.why.find("util read 120%"), std::string::npos) << v.why;
  in = {};
  in.util = 0.5;  // raw trace: no dataloader figure
  EXPECT_NE(lp::decide(in).why.find("not measurable from trace alone"), std::string::npos);
  EXPECT_EQ(lp::bound_label("host / launch"), "HOST/LAUNCH-BOUND");
  EXPECT_NE(lp::bound_lever("dataloader").find("workers"), std::string::npos);
}

// ------------------------------------------------------------------ analysis
TEST(ProfileAnalyze, UnionUtilisationPhasesAndWindow) {
  const json trace = synthetic_trace();
  const json summary = synthetic_summary();
  const json p = lp::analyze_trace(trace, &summary, "t.json");
  EXPECT_EQ(p["schema"], "libreyolo.profile.analysis/v1");
  // The whole unsynced half: 6 steps.
  EXPECT_EQ(p["window"]["real_steps"], 6);
  EXPECT_EQ(p["kernels_per_step"], 2);
  // Union 600 us of a 1 ms step; the sum (800 us) would have read "compute".
  EXPECT_DOUBLE_EQ(p["gpu_busy_ms_per_step"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(p["gpu_busy_sum_ms_per_step"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(p["gpu_util"].get<double>(), 0.6);
  EXPECT_EQ(p["bound"], "host / launch");
  EXPECT_DOUBLE_EQ(p["tensorcore_pct"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(p["mean_kernel_us"].get<double>(), 400.0);
  EXPECT_DOUBLE_EQ(p["memcpy_ms_per_step"].get<double>(), 0.02);
  EXPECT_DOUBLE_EQ(p["host_overhead_ms_per_step"].get<double>(), 0.39);  // 1 - 0.6 - 0.01
  EXPECT_EQ(p["unique_kernels"], 2);
  // Loss is a phase of its own; the elementwise kernel is filed under the phase that launched it.
  std::map<std::string, json> rows;
  for (const auto& r : p["phases"]) rows[r["phase"]] = r;
  ASSERT_TRUE(rows.count("forward") && rows.count("loss") && rows.count("backward"));
  EXPECT_DOUBLE_EQ(rows["forward"]["gpu_ms_per_step"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(rows["loss"]["gpu_ms_per_step"].get<double>(), 0.4);
  EXPECT_EQ(rows["loss"]["kernels_per_step"], 1);
  EXPECT_DOUBLE_EQ(rows["loss"]["wall_ms_per_step"].get<double>(), 0.05);
  EXPECT_EQ(p["kernels_by_phase"]["loss"][0]["category"], "elementwise");
  EXPECT_EQ(p["metrics"]["loss_kernels"], 1);
  EXPECT_EQ(p["metrics"]["bound"], "host / launch");
  ASSERT_EQ(p["categories"].size(), 2u);
  EXPECT_DOUBLE_EQ(p["categories"][0]["pct"].get<double>(), 50.0);
  EXPECT_EQ(p["top_kernels"][0]["count_per_step"], 1);
  EXPECT_EQ(p["ops_by_phase"]["loss"][0]["op"], "aten::mse_loss");
}

TEST(ProfileAnalyze, WorkBetweenStepsIsNotPartOfAStep) {
  // Ten 1 ms steps, 5 ms apart. Inside each: one kernel busy 850 us (launched in the step, it
  // ends after the step's CPU span). Between steps (say an epoch-end validation): a 3 ms kernel
  // and ten cudaMalloc/free. Per-step figures count only what the steps launched, over the time
  // inside the steps: 85% busy -> compute, no memory pressure.
  json ev = json::array();
  for (int i = 0; i < 10; ++i) {
    const double t = 10000 + i * 5000.0;
    ev.push_back(X("user_annotation", "ProfilerStep#" + std::to_string(i), t, 1000));
    ev.push_back(X("cuda_runtime", "cudaLaunchKernel", t + 10, 5, 1, 2 * i));
    ev.push_back(X("kernel", kHopperConv, t + 300, 850, 7, 2 * i));
    ev.push_back(X("cuda_runtime", "cudaLaunchKernel", t + 1500, 5, 1, 2 * i + 1));
    ev.push_back(X("kernel", kElementwise, t + 1510, 3000, 7, 2 * i + 1));
    for (int k = 0; k < 10; ++k) ev.push_back(X("cuda_runtime", k % 2 ? "cudaFree" : "cudaMalloc", t + 2000 + k, 1));
  }
  const json summary = synthetic_summary();
  const json p = lp::analyze_trace({{"traceEvents", ev}}, &summary, "gaps.json");
  EXPECT_EQ(p["window"]["real_steps"], 6);  // the whole unsynced half
  EXPECT_DOUBLE_EQ(p["window_step_ms"].get<double>(), 1.0);
  EXPECT_EQ(p["kernels_per_step"], 1);
  EXPECT_DOUBLE_EQ(p["gpu_busy_ms_per_step"].get<double>(), 0.85);
  EXPECT_DOUBLE_EQ(p["gpu_util"].get<double>(), 0.85);
  EXPECT_EQ(p["cuda_mallocs_per_step"], 0);
  EXPECT_EQ(p["bound"], "compute");
  // The timeline still shows what ran between the steps.
  const json t = lp::timeline_events({{"traceEvents", ev}}, &summary);
  int between = 0;
  for (const auto& e : t["events"])
    if (e["lane"] == "GPU kernels" && e["d"].get<double>() == 3.0) ++between;
  EXPECT_GE(between, 3);
}

TEST(ProfileCategorise, OwnFusedBatchNormKernelsAreReductionNorm) {
  for (const char* n : {"void libreyolo::kernels::(anonymous namespace)::bn_stats_kernel<c10::BFloat16>(...)",
                        "void libreyolo::kernels::(anonymous namespace)::bn_apply_act_kernel<float>(...)",
                        "void libreyolo::kernels::(anonymous namespace)::bn_backward_reduce_kernel<c10::Half>(...)",
                        "void libreyolo::kernels::(anonymous namespace)::bn_backward_elemt_kernel<float>(...)"}) {
    EXPECT_EQ(lp::kernel_category(n), "reduction / norm") << n;
    EXPECT_NE(lp::kernel_label(n).find("batchnorm"), std::string::npos) << n;
  }
}

TEST(ProfileAnalyze, MemoryPressureAndDataloaderVerdicts) {
  const json s = synthetic_summary();
  EXPECT_EQ(lp::analyze_trace(synthetic_trace(6), &s, "t")["bound"], "memory-pressure");
  EXPECT_EQ(lp::analyze_trace(synthetic_trace(6), &s, "t")["cuda_mallocs_per_step"], 6);
  const json s2 = synthetic_summary(0.3);
  EXPECT_EQ(lp::analyze_trace(synthetic_trace(), &s2, "t")["bound"], "dataloader");
}

TEST(ProfileAnalyze, RawTraceUsesCpuMarkersOnly) {
  // 1.6.0's window rule on CPU markers: ts[2] .. ts[8] = 6 steps; the GPU copies are ignored.
  const json p = lp::analyze_trace(synthetic_trace(0, true), nullptr, "raw.json");
  EXPECT_EQ(p["window"]["real_steps"], 6);
  EXPECT_DOUBLE_EQ(p["step_ms"].get<double>(), 1.0);
  EXPECT_TRUE(p["dataload_frac"].is_null());
  EXPECT_NE(p["bound_why"].get<std::string>().find("not measurable"), std::string::npos);
}

TEST(ProfileAnalyze, CpuTraceTakesBusyTimeFromOps) {
  json ev = json::array();
  for (int i = 0; i < 6; ++i) {
    const double t = i * 1000.0;
    ev.push_back(X("user_annotation", "ProfilerStep#" + std::to_string(i), t, 1000));
    ev.push_back(X("user_annotation", "step/dataload", t, 100));
    ev.push_back(X("cpu_op", "aten::empty", t + 10, 50));  // inside dataload: not training work
    ev.push_back(X("cpu_op", "aten::conv2d", t + 100, 500));
    ev.push_back(X("cpu_op", "aten::convolution", t + 200, 100));  // nested: counted once
    ev.push_back(X("cpu_op", "aten::add", t + 700, 100, 2));       // another thread
  }
  json summary = synthetic_summary();
  summary["meta"]["device"] = "cpu";
  summary["window"]["real_steps"] = 6;
  const json p = lp::analyze_trace({{"traceEvents", ev}}, &summary, "cpu.json");
  EXPECT_EQ(p["busy_source"], "cpu_ops");
  EXPECT_DOUBLE_EQ(p["gpu_busy_ms_per_step"].get<double>(), 0.5);
  EXPECT_EQ(p["bound"], "host / launch");
  EXPECT_EQ(p["kernels_per_step"], 0);
}

TEST(ProfileAnalyze, NotATraceThrows) {
  EXPECT_THROW(lp::analyze_trace(json::array(), nullptr, "x"), std::runtime_error);
  EXPECT_THROW(lp::analyze_trace(json{{"a", 1}}, nullptr, "x"), std::runtime_error);
}

// ------------------------------------------------------------------ compare / what-if
TEST(ProfileCompare, SignificanceOnlyWithRepeats) {
  json a = {{"img_per_s", 100.0}, {"img_per_s_std", 2.0}, {"img_per_s_n", 3}, {"step_ms", 160.0},
            {"config", {{"batch", 16}}}, {"bound", "host / launch"}};
  json b = a;
  b["img_per_s"] = 110.0;
  json c = lp::compare_profiles(a, b, "a", "b");
  // SE = sqrt(4/3 + 4/3) = 1.633; 2*SE = 3.27 < 10.
  EXPECT_EQ(c["img_per_s"]["significant"], true);
  EXPECT_EQ(c["img_per_s"]["significance"], "|d|=10.00 vs 2*SE=3.27");
  EXPECT_DOUBLE_EQ(c["ms_per_image"]["before"].get<double>(), 10.0);
  b["img_per_s"] = 102.0;
  EXPECT_EQ(lp::compare_profiles(a, b, "a", "b")["img_per_s"]["significant"], false);
  b.erase("img_per_s_n");
  c = lp::compare_profiles(a, b, "a", "b");
  EXPECT_TRUE(c["img_per_s"]["significant"].is_null());
  EXPECT_NE(c["img_per_s"]["significance"].get<std::string>().find("single run"), std::string::npos);
  b.erase("img_per_s");
  EXPECT_EQ(lp::compare_profiles(a, b, "a", "b")["img_per_s"]["significance"], "img/s unavailable");
}

TEST(ProfileWhatIf, HostAndComputeArithmetic) {
  json p = {{"step_ms", 100.0},
            {"config", {{"batch", 16}}},
            {"host_overhead_ms_per_step", 60.0},
            {"launches_per_step", 1000},
            {"gpu_busy_ms_per_step", 30.0},
            {"gpu_util", 0.3},
            {"dataload_ms", 10.0},
            {"bound", "host / launch"},
            {"categories", {{{"name", "gemm / conv"}, {"pct", 50.0}, {"ms_per_step", 15.0}},
                            {{"name", "elementwise"}, {"pct", 50.0}, {"ms_per_step", 15.0}}}}};
  // 60 us per launch; removing elementwise removes 1000*15/30 = 500 launches = 30 ms of host time.
  json w = lp::what_if(p, std::string("ELEMENT"), std::nullopt);
  EXPECT_EQ(w["removed"]["launches"], 500);
  EXPECT_DOUBLE_EQ(w["step_ms"]["projected"].get<double>(), 70.0);
  EXPECT_DOUBLE_EQ(w["img_per_s"]["projected"].get<double>(), 228.57);
  EXPECT_DOUBLE_EQ(w["img_per_s"]["now"].get<double>(), 160.0);
  // Removing more launches than exist is floored by the GPU work plus the input stall.
  w = lp::what_if(p, std::nullopt, 2000LL);
  EXPECT_DOUBLE_EQ(w["step_ms"]["projected"].get<double>(), 40.0);
  // Compute-bound: the GPU work removed comes off the step, floored by the host time.
  p["gpu_util"] = 0.9;
  p["gpu_busy_ms_per_step"] = 90.0;
  p["host_overhead_ms_per_step"] = 5.0;
  p["categories"][0]["ms_per_step"] = 40.0;
  w = lp::what_if(p, std::string("gemm"), std::nullopt);
  EXPECT_DOUBLE_EQ(w["step_ms"]["projected"].get<double>(), 60.0);
  EXPECT_NE(w["mechanism"].get<std::string>().find("compute-bound"), std::string::npos);
  EXPECT_THROW(lp::what_if(p, std::string("nosuch"), std::nullopt), libreyolo::UsageError);
  EXPECT_THROW(lp::what_if(p, std::nullopt, std::nullopt), libreyolo::UsageError);
}

TEST(ProfileRepeat, AggregatesTrialsAndFeedsCompare) {
  json a = lp::analyze_trace(synthetic_trace(), nullptr, "t0");
  json b = a, c = a;
  a["img_per_s"] = 100.0;
  b["img_per_s"] = 104.0;
  c["img_per_s"] = 102.0;
  a["kernels_per_step"] = 10;
  b["kernels_per_step"] = 12;
  c["kernels_per_step"] = 14;
  a["gpu_util"] = 0.5;
  b["gpu_util"] = 0.6;
  c["gpu_util"] = 0.7;
  c["bound"] = "compute";
  const json r = lp::aggregate_repeat({a, b, c}, {"p0/profile.json", "p1/profile.json", "p2/profile.json"});
  EXPECT_DOUBLE_EQ(r["img_per_s"].get<double>(), 102.0);
  EXPECT_DOUBLE_EQ(r["img_per_s_std"].get<double>(), 1.63);  // population std of 100, 104, 102
  EXPECT_EQ(r["img_per_s_n"], 3);
  EXPECT_EQ(r["metrics"]["img_per_s_n"], 3);
  EXPECT_EQ(r["kernels_per_step"], 12);
  EXPECT_TRUE(r["kernels_per_step"].is_number_integer());
  EXPECT_DOUBLE_EQ(r["gpu_util"].get<double>(), 0.6);
  EXPECT_EQ(r["bound"], "mixed");
  EXPECT_EQ(r["aggregation"]["representative_profile"], "p2/profile.json");
  EXPECT_EQ(r["schema"], lp::kSchema);
  // Two repeat files compare with a significance call.
  json r2 = r;
  r2["img_per_s"] = 120.0;
  EXPECT_EQ(lp::compare_profiles(r, r2, "a", "b")["img_per_s"]["significant"], true);
}

// ------------------------------------------------------------------ readers
TEST(ProfileReaders, AcceptTheReferenceExampleProfile) {
  const auto ex = example_profile();
  if (!ex) GTEST_SKIP() << "LibreYOLO's example profile.json not found (../shared/reference/profile_example)";
  std::string out, err;
  ASSERT_EQ(cli({"summary", *ex}, &out, &err), 0) << err;
  EXPECT_NE(out.find("HOST/LAUNCH-BOUND"), std::string::npos) << out;
  ASSERT_EQ(cli({"summary", *ex, "--json"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["kernels_per_step"], 7298);
  ASSERT_EQ(cli({"get", *ex, "gpu_util"}, &out, &err), 0);
  EXPECT_EQ(out, "0.264\n");
  ASSERT_EQ(cli({"get", *ex, "bound", "--json"}, &out, &err), 0);
  EXPECT_EQ(json::parse(out)["bound"], "host / launch");
  ASSERT_EQ(cli({"get", *ex}, &out, &err), 0);
  EXPECT_NE(out.find("forward_gpu_ms\n"), std::string::npos);
  ASSERT_EQ(cli({"phases", *ex, "--json"}, &out, &err), 0);
  EXPECT_EQ(json::parse(out)["phases"].size(), 5u);
  ASSERT_EQ(cli({"kernels", *ex, "--grep", "^nvjet", "--json"}, &out, &err), 0) << err;
  const json k = json::parse(out);
  EXPECT_GT(k["matched"].get<int>(), 10);
  ASSERT_EQ(cli({"kernels", *ex, "--top", "3", "--sort", "count", "--phase", "forward", "--json"}, &out, &err), 0);
  const json kf = json::parse(out);
  ASSERT_EQ(kf["kernels"].size(), 3u);
  EXPECT_GE(kf["kernels"][0]["count_per_step"].get<int>(), kf["kernels"][1]["count_per_step"].get<int>());
  ASSERT_EQ(cli({"kernels", *ex, "--tensorcore", "--category", "GEMM"}, &out, &err), 0);
  ASSERT_EQ(cli({"ops", *ex, "--top", "5", "--json"}, &out, &err), 0);
  EXPECT_EQ(json::parse(out)["ops"].size(), 5u);
  ASSERT_EQ(cli({"compare", *ex, *ex, "--json"}, &out, &err), 0);
  EXPECT_TRUE(json::parse(out)["img_per_s"]["significant"].is_null());
  ASSERT_EQ(cli({"what-if", *ex, "--remove-category", "reduction", "--json"}, &out, &err), 0) << err;
  const json w = json::parse(out);
  EXPECT_LT(w["step_ms"]["projected"].get<double>(), 347.5);
  EXPECT_EQ(cli({"what-if", *ex, "--remove-launches", "1000"}, &out, &err), 0);
  // Errors: unknown metric / phase / category, no what-if option.
  EXPECT_EQ(cli({"get", *ex, "nope"}, &out, &err), 2);
  EXPECT_NE(err.find("unknown metric 'nope'"), std::string::npos) << err;
  EXPECT_EQ(cli({"kernels", *ex, "--phase", "nope"}, &out, &err), 2);
  EXPECT_NE(err.find("available: "), std::string::npos) << err;
  EXPECT_EQ(cli({"what-if", *ex}, &out, &err), 2);
  EXPECT_EQ(cli({"what-if", *ex, "--remove-category", "nope"}, &out, &err), 2);
  EXPECT_EQ(cli({"kernels", *ex, "--bogus"}, &out, &err), 2);
  EXPECT_EQ(cli({"kernels", *ex, "--grep", "("}, &out, &err), 2);
}

TEST(ProfileReaders, ExitCodesAndRawTraces) {
  const std::string d = scratch("readers");
  std::string out, err;
  EXPECT_EQ(cli({"summary", d + "/missing.json"}, &out, &err), 2);
  EXPECT_NE(err.find("not found: "), std::string::npos) << err;
  // A file that is not JSON, or cut short, is a bad file (exit 2) named with where it stops, in
  // the product's words (no JSON library text).
  write_file(d + "/bad.json", "{not json");
  EXPECT_EQ(cli({"summary", d + "/bad.json"}, &out, &err), 2);
  EXPECT_NE(err.find("bad.json is not a profile: it is not valid JSON"), std::string::npos) << err;
  EXPECT_EQ(err.find("json.exception"), std::string::npos) << err;
  write_file(d + "/cut.json", lp::analyze_trace(synthetic_trace(), nullptr, "t").dump().substr(0, 200));
  EXPECT_EQ(cli({"summary", d + "/cut.json"}, &out, &err), 2);
  EXPECT_NE(err.find("stops parsing at byte"), std::string::npos) << err;
  write_file(d + "/other.json", "{\"a\": 1}");
  EXPECT_EQ(cli({"summary", d + "/other.json"}, &out, &err), 1);
  EXPECT_EQ(cli({"run", "data.yaml"}, &out, &err), 2);
  EXPECT_NE(err.find("use the libreyolo command"), std::string::npos) << err;  // the library has only the readers
  EXPECT_EQ(cli({"infer"}, &out, &err), 2);
  EXPECT_EQ(cli({"frobnicate", "x"}, &out, &err), 2);
  EXPECT_EQ(cli({}, &out, &err), 2);
  EXPECT_EQ(cli({"--help"}, &out, &err), 0);
  // A raw trace is analysed with its sibling summary.
  write_file(d + "/profile_trace.json", synthetic_trace().dump());
  write_file(d + "/profile_summary.json", synthetic_summary().dump());
  ASSERT_EQ(cli({"summary", d + "/profile_trace.json", "--json"}, &out, &err), 0) << err;
  const json s = json::parse(out);
  EXPECT_EQ(s["bound"], "host / launch");
  EXPECT_DOUBLE_EQ(s["gpu_util"].get<double>(), 0.6);
  // A profile.json we write is read back by the same readers.
  write_file(d + "/profile.json", lp::analyze_trace(synthetic_trace(), nullptr, "t").dump());
  for (const char* sub : {"summary", "phases", "kernels", "ops"})
    EXPECT_EQ(cli({sub, d + "/profile.json", "--json"}, &out, &err), 0) << sub << err;
  ASSERT_EQ(cli({"compare", d + "/profile.json", d + "/profile_trace.json", "--json"}, &out, &err), 0) << err;
  EXPECT_NO_THROW(json::parse(out));
  // JSON errors go to stdout with --json.
  EXPECT_EQ(cli({"get", d + "/profile.json", "nope", "--json"}, &out, &err), 2);
  EXPECT_EQ(json::parse(out)["message"].get<std::string>().rfind("unknown metric", 0), 0u);
}

// ------------------------------------------------------------------ timeline in a browser
namespace {
std::optional<std::string> find_chromium() {
  for (const char* b : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
    std::string out;
    if (sh(std::string("command -v ") + b, &out) == 0 && !out.empty()) return out.substr(0, out.find('\n'));
  }
  return std::nullopt;
}
}  // namespace

TEST(ProfileTimeline, PageEmbedsDataWithoutNetwork) {
  json payload = lp::timeline_events(synthetic_trace(), nullptr);
  payload["meta"] = synthetic_summary()["meta"];
  payload["analysis"] = {{"gpu_util", 0.6}, {"bound", "host / launch"}, {"bound_why", "why </script><b>"}};
  const std::string html = lp::timeline_html(payload);
  EXPECT_EQ(html.find("</script><b>"), std::string::npos);  // escaped inside the data block
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_GT(payload["events"].size(), 20u);
  EXPECT_EQ(payload["lane_rows"]["GPU kernels"], 2);  // the two overlapping streams get two rows
  EXPECT_GT(payload["flows"].size(), 0u);
}

TEST(ProfileTimeline, DrawsInHeadlessChromium) {
  const auto chromium = find_chromium();
  if (!chromium) GTEST_SKIP() << "chromium not installed: timeline.html not checked in a browser (apt-get install chromium)";
  const std::string d = scratch("timeline");
  json trace = synthetic_trace();
  json summary = synthetic_summary();
  json p = lp::analyze_trace(trace, &summary, "t");
  json payload = lp::timeline_events(trace, &summary);
  payload["meta"] = summary["meta"];
  json a = {{"gpu_util", p["gpu_util"]}, {"bound", p["bound"]}, {"bound_why", p["bound_why"]},
            {"lever", p["lever"]}, {"gpu_busy_ms_per_step", p["gpu_busy_ms_per_step"]}, {"step_ms", p["step_ms"]},
            {"img_per_s", p["img_per_s"]}, {"kernels_per_step", p["kernels_per_step"]},
            {"mean_kernel_us", p["mean_kernel_us"]}, {"categories", p["categories"]}, {"phases", p["phases"]},
            {"top_kernels", p["top_kernels"]}, {"tensorcore_pct", p["tensorcore_pct"]}};
  payload["analysis"] = a;
  const std::string page = d + "/timeline.html";
  ASSERT_TRUE(lp::write_timeline(page, payload));
  const std::string flags = " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions "
                            "--disable-background-networking --user-data-dir=" + d + "/profile ";
  std::string dom;
  const int rc = sh("timeout 90 " + *chromium + flags + "--enable-logging=stderr --v=0 --dump-dom file://" + page, &dom);
  ASSERT_EQ(rc, 0) << dom;
  EXPECT_NE(dom.find("drawn lanes=5"), std::string::npos) << dom.substr(0, 4000);
  for (const char* bad : {"lyp-status\">error", "Uncaught", ":CONSOLE", "console error"}) {
    const auto at = dom.find(bad);
    EXPECT_EQ(at, std::string::npos) << bad << ": " << dom.substr(at == std::string::npos ? 0 : (at > 300 ? at - 300 : 0), 700);
  }
  // A screenshot for the test log folder.
  const fs::path logs = fs::current_path() / "test_logs";
  fs::create_directories(logs);
  std::string shot_log;
  sh("timeout 90 " + *chromium + flags + "--screenshot=" + (logs / "timeline_screenshot.png").string() +
         " --window-size=1400,900 file://" + page,
     &shot_log);
  EXPECT_TRUE(fs::exists(logs / "timeline_screenshot.png")) << shot_log;
}

// ------------------------------------------------------------------ inference profiler rules
TEST(ProfileInfer, PercentilesRoundHalfToEvenAsTheReference) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(lp::percentile(v, 50), 5.0);   // 0.5 * 9 = 4.5 -> 4 (half to even)
  EXPECT_DOUBLE_EQ(lp::percentile(v, 90), 9.0);   // 8.1 -> 8
  EXPECT_DOUBLE_EQ(lp::percentile(v, 99), 10.0);  // 8.91 -> 9
  EXPECT_DOUBLE_EQ(lp::percentile({3, 7}, 50), 3.0);  // 0.5 -> 0
  EXPECT_DOUBLE_EQ(lp::percentile({}, 50), 0.0);
}

TEST(ProfileInfer, VerdictRulesFirstMatchWins) {
  EXPECT_EQ(lp::inference_verdict(0, 0, 0, true, 1.0).first, "inference");
  EXPECT_EQ(lp::inference_verdict(1, 2, 3, true, 1.0).first, "nms / postprocess");  // post 50% >= fwd
  EXPECT_EQ(lp::inference_verdict(4, 2, 1, true, 1.0).first, "preprocess");         // pre 57%
  EXPECT_EQ(lp::inference_verdict(1, 5, 1, false, 0.1).first, "compute");           // CPU
  EXPECT_EQ(lp::inference_verdict(1, 5, 1, true, 0.5).first, "host / launch");       // util < 0.8
  EXPECT_NE(lp::inference_verdict(1, 5, 1, true, 0.5).second.find("cuda_graph=true"), std::string::npos);
  // Already graphed: the same bound, but not the lever it already uses.
  const auto graphed = lp::inference_verdict(1, 5, 1, true, 0.5, true);
  EXPECT_EQ(graphed.first, "host / launch");
  EXPECT_EQ(graphed.second.find("cuda_graph=true"), std::string::npos) << graphed.second;
  EXPECT_EQ(lp::inference_verdict(1, 5, 1, true, 0.9).first, "compute");
  // post >= fwd but under 35% of the step: not the postprocess rule.
  EXPECT_EQ(lp::inference_verdict(10, 3, 3, true, 0.9).first, "preprocess");
  EXPECT_NE(lp::inference_verdict(1, 2, 3, true, 1.0).second.find("max_det"), std::string::npos);
}
