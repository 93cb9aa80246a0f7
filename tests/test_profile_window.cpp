// The profiler's measuring window driven like the train loop, with real torch ops on the CPU:
// Kineto CPU activities, the four files, and the readers on what it wrote.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "profile/analysis.hpp"
#include "profile/profile_cli.hpp"
#include "profile/window.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
namespace lp = libreyolo::profile;

namespace {

lp::Meta cpu_meta() {
  lp::Meta m;
  m.model = "tiny-conv";
  m.device = "cpu";
  m.batch = 4;
  m.imgsz = {32};
  m.amp = false;
  m.workers = 0;
  return m;
}

// One training iteration of a small conv net, with the window's hooks where the loop puts them.
void iteration(lp::Window& w, torch::Tensor& weight, torch::Tensor& bias) {
  using lp::Phase;
  w.step_begin();
  w.dataload_begin();
  torch::Tensor x = torch::randn({4, 3, 32, 32});
  torch::Tensor y = torch::randn({4, 8, 32, 32});
  w.dataload_end();
  w.phase_begin(Phase::ToDevice);
  x = x.to(torch::kCPU).contiguous();
  w.phase_end(Phase::ToDevice);
  w.phase_begin(Phase::Forward);
  torch::Tensor out = torch::silu(torch::conv2d(x, weight, bias, 1, 1));
  w.phase_end(Phase::Forward);
  w.phase_begin(Phase::Loss);
  torch::Tensor loss = torch::mse_loss(out, y);
  w.phase_end(Phase::Loss);
  w.phase_begin(Phase::Backward);
  loss.backward();
  w.phase_end(Phase::Backward);
  w.phase_begin(Phase::Optimizer);
  {
    torch::NoGradGuard ng;
    weight.sub_(weight.grad() * 0.01);
    bias.sub_(bias.grad() * 0.01);
    weight.grad().zero_();
    bias.grad().zero_();
  }
  w.phase_end(Phase::Optimizer);
  w.step_end();
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

}  // namespace

TEST(ProfileWindow, CpuWindowWritesFourFilesTheReadersAccept) {
  const std::string dir = libreyolo::test::temp_dir("profwin");
  torch::manual_seed(0);
  torch::Tensor weight = (torch::randn({8, 3, 3, 3}) * 0.1).requires_grad_();
  torch::Tensor bias = torch::zeros({8}).requires_grad_();
  lp::Window w(/*warmup=*/2, /*steps=*/6, torch::Device(torch::kCPU), cpu_meta(), dir);
  EXPECT_FALSE(w.measuring());
  EXPECT_NE(w.live_verdict().find("warmup"), std::string::npos) << w.live_verdict();
  int iters = 0;
  std::string live;
  while (!w.finished() && iters < 20) {
    iteration(w, weight, bias);
    ++iters;
    if (iters == 4) live = w.live_verdict();
  }
  ASSERT_TRUE(w.finished());
  EXPECT_EQ(iters, 8);  // 2 warm-up + 6 measured
  EXPECT_NE(live.find("prelim"), std::string::npos) << live;
  const lp::Report r = w.finish();
  std::cout << r.text;  // the report as the trainer prints it, for the test log
  ASSERT_TRUE(r.produced);
  EXPECT_GT(r.step_ms, 0);
  EXPECT_GT(r.img_per_s, 0);
  EXPECT_TRUE(r.bound == "dataloader" || r.bound == "host / launch" || r.bound == "compute" ||
              r.bound == "memory-pressure")
      << r.bound;
  EXPECT_NE(r.text.find(">> VERDICT: "), std::string::npos) << r.text;
  EXPECT_EQ(w.live_verdict(), "profile: " + lp::bound_label(r.bound));
  EXPECT_NE(r.bound, "memory-pressure");  // no allocator on the CPU
  for (const char* f : {"profile_trace.json", "profile_summary.json", "profile.json", "timeline.html"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << f << "\n" << r.text;
  ASSERT_TRUE(r.analysed) << r.text;
  EXPECT_EQ(r.busy_source, "cpu_ops");
  EXPECT_GT(r.gpu_busy_ms_per_step, 0);

  // profile_trace.json: a Chrome trace with our step markers and phase scopes.
  const json trace = read_json(fs::path(dir) / "profile_trace.json");
  ASSERT_TRUE(trace.contains("traceEvents"));
  int markers = 0, loss_scopes = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string n = e.value("name", std::string(""));
    if (n.rfind("ProfilerStep#", 0) == 0) ++markers;
    if (n == "step/loss") ++loss_scopes;
  }
  EXPECT_EQ(markers, 6);
  EXPECT_EQ(loss_scopes, 6);

  // profile_summary.json: the window, real and synced figures, loss a phase of its own.
  const json s = read_json(fs::path(dir) / "profile_summary.json");
  EXPECT_EQ(s["window"]["warmup"], 2);
  EXPECT_EQ(s["window"]["real_steps"], 3);
  EXPECT_EQ(s["window"]["synced_steps"], 3);
  EXPECT_TRUE(s["composition_ms"].contains("loss"));
  EXPECT_GT(s["composition_ms"]["forward"].get<double>(), 0);
  EXPECT_EQ(s["bound"], r.bound);
  EXPECT_TRUE(s["analysis"].contains("gpu_util"));

  // profile.json: the schema, and the readers accept it and the raw trace.
  const json p = read_json(fs::path(dir) / "profile.json");
  EXPECT_EQ(p["schema"], lp::kSchema);
  EXPECT_EQ(p["config"]["model"], "tiny-conv");
  std::set<std::string> phases;
  for (const auto& row : p["phases"]) phases.insert(row["phase"]);
  for (const char* ph : {"dataload", "to_device", "forward", "loss", "backward", "optimizer"})
    EXPECT_TRUE(phases.count(ph)) << ph;
  for (const std::string file : {"profile.json", "profile_trace.json"}) {
    for (const char* sub : {"summary", "phases", "kernels", "ops"}) {
      std::ostringstream out, err;
      EXPECT_EQ(lp::run_profile_command({sub, (fs::path(dir) / file).string(), "--json"}, out, err), 0)
          << sub << " " << file << ": " << err.str();
      EXPECT_NO_THROW(json::parse(out.str())) << out.str();
    }
  }
  // timeline.html: one file with the data embedded.
  std::ifstream in(fs::path(dir) / "timeline.html");
  std::stringstream html;
  html << in.rdbuf();
  EXPECT_NE(html.str().find("ProfilerStep#"), std::string::npos);
  EXPECT_NE(html.str().find("lyp-data"), std::string::npos);
  // The page draws in a real browser with the CPU run's data (no GPU lanes, CPU busy panel).
  std::string which;
  if (libreyolo::test::run_command("command -v chromium || command -v chromium-browser || command -v google-chrome",
                                   &which) == 0 &&
      !which.empty()) {
    const std::string bin = which.substr(0, which.find('\n'));
    std::string dom;
    ASSERT_EQ(libreyolo::test::run_command("timeout 90 " + bin +
                                               " --headless --no-sandbox --disable-gpu --no-first-run "
                                               "--user-data-dir=" + dir + "/chrome --enable-logging=stderr --v=0 "
                                               "--dump-dom file://" + dir + "/timeline.html",
                                           &dom),
              0)
        << dom;
    EXPECT_NE(dom.find("drawn lanes="), std::string::npos) << dom.substr(0, 3000);
    EXPECT_EQ(dom.find("Uncaught"), std::string::npos) << dom.substr(0, 3000);
    EXPECT_EQ(dom.find("lyp-status\">error"), std::string::npos);
  } else {
    std::cout << "[ NOTE     ] chromium not installed: the CPU run's timeline.html is not opened in a browser\n";
  }
  // finish() is idempotent.
  EXPECT_EQ(w.finish().profile_path, r.profile_path);
}

TEST(ProfileWindow, UnfilledWindowProducesNothing) {
  const std::string dir = libreyolo::test::temp_dir("profwin_short");
  torch::Tensor weight = (torch::randn({8, 3, 3, 3}) * 0.1).requires_grad_();
  torch::Tensor bias = torch::zeros({8}).requires_grad_();
  lp::Window w(1, 10, torch::Device(torch::kCPU), cpu_meta(), dir);
  for (int i = 0; i < 4; ++i) iteration(w, weight, bias);
  EXPECT_FALSE(w.finished());
  const lp::Report r = w.finish();
  EXPECT_FALSE(r.produced);
  EXPECT_NE(r.text.find("never filled"), std::string::npos) << r.text;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "profile.json"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "profile_trace.json"));
}

TEST(ProfileWindow, AccumulationRoundsTheWindow) {
  int warmup = 5, steps = 20;
  EXPECT_EQ(lp::Window::round_to_accumulation(warmup, steps, 1), "");
  EXPECT_EQ(warmup, 5);
  const std::string line = lp::Window::round_to_accumulation(warmup, steps, 4);
  EXPECT_EQ(warmup, 8);
  EXPECT_EQ(steps, 20);
  EXPECT_EQ(line, "profile window rounded to accumulation boundaries (warmup=8, steps=20, accum=4)");
}
