#include "support.hpp"

#include "core/paths.hpp"

#include <ATen/Context.h>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <mutex>
#include <vector>

namespace fs = std::filesystem;

namespace {
// The GPU tests compare runs bit for bit; a fused convolution plan arriving from a background build
// between two runs would change the second. The test programs (and the CLI they start) build plans
// on the calling thread unless the environment says otherwise; the background mode has its own test.
[[maybe_unused]] const bool kPlansOnTheCallingThread = [] {
  setenv("LIBREYOLO_CUDNN_PLAN_BUILD", "wait", /*overwrite=*/0);
  return true;
}();
}  // namespace

namespace libreyolo::test {

std::optional<std::string> fixtures_dir() {
  const char* env = std::getenv("LIBREYOLO_FIXTURES");
  std::vector<std::string> candidates;
  if (env && *env) candidates.emplace_back(env);
  for (const auto& c : candidates) {
    if (fs::exists(fs::path(c) / "yolo9t_nc80_s320.pt")) return c;
  }
  return std::nullopt;
}

namespace {
std::vector<std::string>& temp_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
void cleanup_temp_dirs() {
  if (std::getenv("LIBREYOLO_KEEP_TEMP")) return;
  for (const auto& d : temp_dirs()) libreyolo::remove_tree(d);
}
}  // namespace

std::string temp_dir(const std::string& tag) {
  static std::once_flag once;
  // Build the list before registering the handler: statics are destroyed in reverse order of
  // registration, so the list must outlive the atexit handler that reads it.
  std::call_once(once, [] {
    temp_dirs();
    std::atexit(cleanup_temp_dirs);
  });
  std::string tmpl = (fs::temp_directory_path() / ("libreyolo_" + tag + "_XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  temp_dirs().emplace_back(buf.data());
  return buf.data();
}

int run_command(const std::string& cmd, std::string* output) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  std::string out;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = pclose(p);
  if (output) *output = out;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::optional<std::string> python_with_torch() {
  static std::optional<std::string> cached;
  static bool probed = false;
  if (probed) return cached;
  probed = true;
  std::vector<std::string> cands;
  if (const char* e = std::getenv("LIBREYOLO_PY")) cands.emplace_back(e);
  cands.emplace_back(LIBREYOLO_TEST_PYTHON);
  for (const auto& py : cands) {
    if (run_command(py + " -c 'import torch'") == 0) return cached = py;
  }
  return std::nullopt;
}

bool cuda_available() { return torch::cuda::is_available(); }

double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  auto ad = a.detach().to(torch::kCPU, torch::kDouble);
  auto bd = b.detach().to(torch::kCPU, torch::kDouble);
  double denom = std::max(bd.abs().max().item<double>(), 1e-12);
  return (ad - bd).abs().max().item<double>() / denom;
}

void check_rel(const std::string& what, const torch::Tensor& got, const torch::Tensor& want, double bound) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double e = rel_err(got, want);
  EXPECT_LE(e, bound) << what;
  std::printf("  %-44s rel err %.3g\n", what.c_str(), e);
}

std::vector<Detection> detections(const torch::Tensor& boxes, const torch::Tensor& scores, const torch::Tensor& classes) {
  const auto b = boxes.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto s = scores.detach().to(torch::kCPU, torch::kFloat).contiguous();
  const auto c = classes.detach().to(torch::kCPU, torch::kLong).contiguous();
  std::vector<Detection> out;
  for (int64_t i = 0; i < s.size(0); ++i) {
    const float* r = b[i].data_ptr<float>();
    out.push_back({r[0], r[1], r[2], r[3], s[i].item<float>(), c[i].item<int64_t>()});
  }
  return out;
}

double expect_same_detections(const std::vector<Detection>& got, const std::vector<Detection>& want,
                              const std::string& what, double score_tol, double box_tol) {
  EXPECT_EQ(got.size(), want.size()) << what;
  std::vector<bool> used(want.size(), false);
  double worst = 0.0;
  for (const Detection& g : got) {
    bool found = false;
    for (size_t j = 0; j < want.size() && !found; ++j) {
      const Detection& w = want[j];
      const double d = std::max({std::abs(g.x1 - w.x1), std::abs(g.y1 - w.y1), std::abs(g.x2 - w.x2),
                                 std::abs(g.y2 - w.y2)});
      if (used[j] || g.cls != w.cls || std::abs(g.score - w.score) > score_tol || d > box_tol) continue;
      used[j] = found = true;
      worst = std::max(worst, d);
    }
    EXPECT_TRUE(found) << what << ": a detection of class " << g.cls << ", score " << g.score << " at (" << g.x1
                       << ", " << g.y1 << ", " << g.x2 << ", " << g.y2 << ") is not the reference's";
  }
  return worst;
}

CudnnSettings::CudnnSettings(bool benchmark, bool deterministic, bool allow_tf32) {
  auto& ctx = at::globalContext();
  benchmark_ = ctx.benchmarkCuDNN();
  deterministic_ = ctx.deterministicCuDNN();
  tf32_ = ctx.allowTF32CuDNN();
  ctx.setBenchmarkCuDNN(benchmark);
  ctx.setDeterministicCuDNN(deterministic);
  ctx.setAllowTF32CuDNN(allow_tf32);
}

CudnnSettings::~CudnnSettings() {
  auto& ctx = at::globalContext();
  ctx.setBenchmarkCuDNN(benchmark_);
  ctx.setDeterministicCuDNN(deterministic_);
  ctx.setAllowTF32CuDNN(tf32_);
}

std::vector<TsvEntry> read_state_dict_tsv(const std::string& file_name) {
  const std::string path = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + file_name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<TsvEntry> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    TsvEntry e;
    std::string shape;
    std::getline(ls, e.key, '	');
    std::getline(ls, shape, '	');
    std::getline(ls, e.dtype, '	');
    for (char& c : shape)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream ss(shape);
    int64_t d;
    while (ss >> d) e.shape.push_back(d);
    out.push_back(std::move(e));
  }
  return out;
}

io::StateDict reference_state_dict_tsv(const std::string& file_name) {
  io::StateDict sd;
  for (const auto& e : read_state_dict_tsv(file_name))
    sd.emplace_back(e.key, torch::zeros(e.shape, e.dtype == "int64" ? torch::kLong
                                                 : e.dtype == "bool" ? torch::kBool
                                                                     : torch::kFloat));
  return sd;
}

const torch::Tensor& state_dict_entry(const io::StateDict& sd, const std::string& key) {
  for (const auto& kv : sd)
    if (kv.first == key) return kv.second;
  throw std::runtime_error("no tensor " + key);
}

NoTF32::NoTF32() {
  auto& ctx = at::globalContext();
  cudnn_ = ctx.allowTF32CuDNN();
  cublas_ = ctx.allowTF32CuBLAS();
  ctx.setAllowTF32CuDNN(false);
  ctx.setAllowTF32CuBLAS(false);
}

NoTF32::~NoTF32() {
  auto& ctx = at::globalContext();
  ctx.setAllowTF32CuDNN(cudnn_);
  ctx.setAllowTF32CuBLAS(cublas_);
}

}  // namespace libreyolo::test
