// Data-parallel training on two GPUs (NCCL): real CLI processes launched with torchrun's
// environment contract, against one GPU; the spawn path (device=0,1). Needs a 2-GPU machine
// (nvidia-h200-x2); skipped, saying so, elsewhere.
#include <filesystem>
#include <regex>

#include <gtest/gtest.h>

#include "conv_bn_act_check.hpp"
#include "data/synthetic.hpp"
#include "layers/conv_bn_act.hpp"
#include "dist_check.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using namespace libreyolo::test;

namespace {

bool two_gpus() { return torch::cuda::is_available() && torch::cuda::device_count() >= 2; }

std::string gpu_dist_dataset() {
  static std::string yaml = [] {
    data::SyntheticOptions o;
    o.train_images = 32;
    o.val_images = 8;
    o.width = 160;
    o.height = 128;
    o.num_classes = 3;
    return data::generate_synthetic_dataset(test::temp_dir("gpu_dist_ds"), o);
  }();
  return yaml;
}

std::vector<std::string> args(const std::string& project, const std::string& name, int epochs, int batch,
                              const std::string& device) {
  return {"train",          "model=yolo9t",  "data=" + gpu_dist_dataset(), "epochs=" + std::to_string(epochs),
          "imgsz=128",      "batch=" + std::to_string(batch),             "device=" + device,
          "workers=4",      "seed=0",        "nbs=0",    "save_period=0", "exist_ok=true",
          "project=" + project, "name=" + name, "warmup_epochs=0", "lr0=0.002", "amp=false"};
}

}  // namespace

// On NCCL: two GPUs at batch 16 each take the optimizer step of one GPU at batch 32
// (fp32 without TF32: LIBREYOLO_TF32=0; SyncBN; averaged gradients and loss normalisers). Also: the BatchNorm running
// statistics after the step (SyncBN's statistics of the global batch) against one GPU's.
TEST(DistGpu, TwoGpusTakeTheStepOfOneGpuWithTheGlobalBatch) {
  if (!two_gpus()) GTEST_SKIP() << "needs two CUDA GPUs (the nvidia-h200-x2 machine)";
  const std::string dir = test::temp_dir("gpu_dist_equal");
  auto a = args(dir, "single", 1, 32, "0");
  a.push_back("val=false");
  {
    const pid_t pid = launch(a, {{"LIBREYOLO_TF32", "0"}, {"LIBREYOLO_DETERMINISTIC", "1"}}, dir + "/single.txt");
    auto st = wait_for(pid, 300);
    ASSERT_TRUE(st && exited_ok(*st)) << slurp(dir + "/single.txt");
  }
  auto one = args(dir, "one", 1, 32, "0");
  one.push_back("val=false");
  auto r1 = run_ranks(1, one, dir, 300);
  ASSERT_TRUE(exited_ok(r1[0].first)) << r1[0].second;
  auto two = args(dir, "dual", 1, 32, "0,1");
  two.push_back("val=false");
  auto r2 = run_ranks(2, two, dir, 300);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(exited_ok(r2[static_cast<size_t>(r)].first)) << r2[static_cast<size_t>(r)].second;
  EXPECT_NE(r2[0].second.find("DDP active: rank=0/2 device=cuda:0 backend=nccl"), std::string::npos) << r2[0].second;
  const auto last = [&](const std::string& n) { return (fs::path(dir) / n / "weights" / "last.pt").string(); };
  const WeightDiff same = weight_diff(last("one"), last("dual"), "train_model");
  const WeightDiff plain = weight_diff(last("single"), last("dual"), "train_model");
  std::printf("[ REPORT   ] NCCL 2 GPUs x batch 16 vs 1 GPU x batch 32, one step, %d tensors: vs a group of one: "
              "worst tensor %.2g (%s), model %.2g; vs plain one GPU: worst tensor %.2g (%s), model %.2g\n",
              same.tensors, same.worst, same.worst_name.c_str(), same.global, plain.worst, plain.worst_name.c_str(),
              plain.global);
  // fp32 without TF32, but cuDNN picks different algorithms for batch 16 and 32 (their rounding
  // differs by ~1e-6 per op): the CPU test holds the 1e-5 bound on exact arithmetic; here the
  // model must agree to 5e-5 and the BatchNorm statistics below to 1e-5.
  EXPECT_LE(same.global, 5e-5);
  EXPECT_LE(plain.global, 5e-5);
  // The BatchNorm buffers alone (running mean and variance after the step).
  const auto ca = io::read_checkpoint(last("single")), cb = io::read_checkpoint(last("dual"));
  const auto sa = io::to_state_dict(*ca.root->get("train_model"), "train_model");
  const auto sb = io::to_state_dict(*cb.root->get("train_model"), "train_model");
  std::map<std::string, torch::Tensor> by_name(sb.begin(), sb.end());
  double num = 0, den = 0;
  int buffers = 0;
  for (const auto& [name, t] : sa) {
    if (name.find("running_") == std::string::npos) continue;
    num += (t - by_name.at(name)).to(torch::kDouble).square().sum().item<double>();
    den += t.to(torch::kDouble).square().sum().item<double>();
    ++buffers;
  }
  const double bn_rel = std::sqrt(num / den);
  std::printf("[ REPORT   ] SyncBN running statistics (%d buffers) vs one GPU's BatchNorm over the global batch: %.2g\n",
              buffers, bn_rel);
  EXPECT_GT(buffers, 100);
  EXPECT_LE(bn_rel, 1e-5);
}

// device=0,1 spawns one worker per GPU; the caller (here the CLI's parent process) gets
// rank 0's result and its best weights.
TEST(DistGpu, SpawnTrainsOnBothGpusAndHandsBackTheResult) {
  if (!two_gpus()) GTEST_SKIP() << "needs two CUDA GPUs (the nvidia-h200-x2 machine)";
  const std::string dir = test::temp_dir("gpu_dist_spawn");
  auto a = args(dir, "run", 2, 16, "0,1");
  a.push_back("--json");
  const pid_t pid = launch(a, {}, dir + "/err.txt");
  auto st = wait_for(pid, 300);
  const std::string err = slurp(dir + "/err.txt");
  ASSERT_TRUE(st && exited_ok(*st)) << err;
  EXPECT_NE(err.find("Multi-GPU: starting 2 worker processes on GPU(s) 0,1"), std::string::npos) << err;
  EXPECT_NE(err.find("DDP active: rank=0/2"), std::string::npos) << err;
  EXPECT_NE(err.find("(spawned workers)"), std::string::npos) << err;
  EXPECT_TRUE(fs::exists(fs::path(dir) / "run" / "weights" / "best.pt"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "run" / "results.csv"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "run2"));  // one run directory: rank 0's
}

// CUDA graphs under multi-GPU training: the step is captured with its NCCL all-reduces (SyncBN
// statistics, loss normalisers, gradients) and replayed on both ranks; the result matches the
// same two-rank run trained eager. fp32 without TF32, and deterministic cuDNN algorithms
// (rank_env sets LIBREYOLO_DETERMINISTIC=1): recorded failing on 2026-11-30 (0.0099 over the
// weights) while each process autotuned, which on one GPU alone made two eager runs differ by 0.01.
TEST(DistGpu, GraphedStepsWithNcclEqualEagerStepsOnTwoGpus) {
  if (!two_gpus()) GTEST_SKIP() << "needs two CUDA GPUs (the nvidia-h200-x2 machine)";
  const std::string dir = test::temp_dir("gpu_dist_graph");
  std::vector<std::vector<std::pair<int, std::string>>> runs;
  for (const char* name : {"eager", "graphed"}) {
    auto a = args(dir, name, 2, 8, "0,1");  // 32 images, 4 per rank: 4 steps per epoch
    a.push_back("val=false");
    if (std::string(name) == "graphed") a.push_back("cuda_graph=true");
    auto r = run_ranks(2, a, dir, 300);
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(exited_ok(r[static_cast<size_t>(k)].first)) << r[static_cast<size_t>(k)].second;
    runs.push_back(r);
  }
  const std::string& log = runs[1][0].second;
  EXPECT_NE(log.find("with their all-reduces"), std::string::npos) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("CUDA graphs: ([0-9]+) of 8 steps replayed"))) << log;
  EXPECT_GE(std::stoi(m[1]), 5) << log;  // captured on the 3rd step, replayed from then on
  const auto last = [&](const std::string& n) { return (fs::path(dir) / n / "weights" / "last.pt").string(); };
  const WeightDiff d = weight_diff(last("eager"), last("graphed"), "train_model");
  std::printf("[ REPORT   ] 2 GPUs, 8 steps, graphed (NCCL inside) vs eager: worst tensor %.2g (%s), model %.2g\n",
              d.worst, d.worst_name.c_str(), d.global);
  EXPECT_LE(d.global, 1e-4);
}

// The small sums of data-parallel training (SyncBN statistics and gradient sums, loss
// normalisers) go through peer memory over NVLink when the ranks share a host (dist/peer_sum.hpp);
// LIBREYOLO_PEER_SUM=0 sends them through NCCL. A sum of two ranks is one float addition per
// element either way (the peer kernel adds in rank order, NCCL's two-rank reduction adds the same
// two values), so with deterministic cuDNN the two runs end with the same bits, eager and graphed.
TEST(DistGpu, PeerMemorySumsEqualNcclSums) {
  if (!two_gpus()) GTEST_SKIP() << "needs two CUDA GPUs (the nvidia-h200-x2 machine)";
  const std::string dir = test::temp_dir("gpu_dist_peer");
  std::map<std::string, std::string> logs;
  for (const char* name : {"nccl", "peer", "peer_graphed"}) {
    auto a = args(dir, name, 2, 8, "0,1");  // 32 images, 4 per rank: 4 steps per epoch
    a.push_back("val=false");
    if (std::string(name) == "peer_graphed") a.push_back("cuda_graph=true");
    Env extra;
    if (std::string(name) == "nccl") extra.emplace_back("LIBREYOLO_PEER_SUM", "0");
    auto r = run_ranks(2, a, dir, 300, extra);
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(exited_ok(r[static_cast<size_t>(k)].first)) << r[static_cast<size_t>(k)].second;
    logs[name] = r[0].second;
  }
  EXPECT_NE(logs["nccl"].find("small sums through nccl (LIBREYOLO_PEER_SUM=0)"), std::string::npos) << logs["nccl"];
  EXPECT_NE(logs["peer"].find("small sums through peer memory"), std::string::npos) << logs["peer"];
  const auto last = [&](const std::string& n) { return (fs::path(dir) / n / "weights" / "last.pt").string(); };
  const WeightDiff d = weight_diff(last("nccl"), last("peer"), "train_model");
  const WeightDiff g = weight_diff(last("peer"), last("peer_graphed"), "train_model");
  std::printf("[ REPORT   ] 2 GPUs, 8 steps: small sums through peer memory vs NCCL: worst tensor %.2g (%s), model "
              "%.2g; graphed vs eager, both through peer memory: worst tensor %.2g, model %.2g\n",
              d.worst, d.worst_name.c_str(), d.global, g.worst, g.global);
  EXPECT_EQ(d.global, 0.0);
  EXPECT_LE(g.global, 1e-4);
}

// The same comparison on one GPU, through the trainer (the CLI): the step runner's own tests
// (GpuStepGraph) are bit for bit, so the trainer's graphed run must equal its eager run too, once
// both runs take the same cuDNN algorithms. Recorded on nvidia-h200-x2 on 2026-11-30 with cuDNN
// autotuning on (the trainer's default): graphed vs eager 0.22 relative over the weights after 25
// steps. Autotuning races algorithms per process, so two eager runs may differ as well: the
// control pair measures that, and the assertion is made with deterministic cuDNN: the eager pair
// once through LIBREYOLO_DETERMINISTIC=1 and once through the `deterministic=true` option, which
// must give the same weights.
TEST(GpuTrainGraph, TrainerGraphedRunEqualsItsEagerRunOnOneGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
  const std::string dir = test::temp_dir("gpu_train_graph");
  std::map<std::string, std::string> logs;
  enum class Det { Off, Env, Option };  // deterministic cuDNN: no, by the environment, by the option
  const auto train = [&](const std::string& name, bool graphed, Det deterministic) {
    auto a = args(dir, name, 2, 8, "0");  // 32 images: 4 steps per epoch, 8 in all
    a.push_back("val=false");
    if (graphed) a.push_back("cuda_graph=true");
    Env env{{"LIBREYOLO_TF32", "0"}};
    if (deterministic == Det::Env) env.emplace_back("LIBREYOLO_DETERMINISTIC", "1");
    if (deterministic == Det::Option) a.push_back("deterministic=true");
    const pid_t pid = launch(a, env, dir + "/" + name + ".txt");
    auto st = wait_for(pid, 300);
    logs[name] = slurp(dir + "/" + name + ".txt");
    ASSERT_TRUE(st && exited_ok(*st)) << logs[name];
  };
  for (const char* n : {"tuned_a", "tuned_b"}) train(n, false, Det::Off);
  train("eager", false, Det::Env);
  train("eager_again", false, Det::Option);
  train("graphed", true, Det::Env);
  if (HasFatalFailure()) return;
  EXPECT_NE(logs["eager"].find("LIBREYOLO_DETERMINISTIC=1"), std::string::npos) << logs["eager"];
  EXPECT_NE(logs["eager_again"].find("deterministic=true: cuDNN deterministic"), std::string::npos)
      << logs["eager_again"];
  std::smatch m;
  ASSERT_TRUE(std::regex_search(logs["graphed"], m, std::regex("CUDA graphs: ([0-9]+) of 8 steps replayed")))
      << logs["graphed"];
  EXPECT_GE(std::stoi(m[1]), 5) << logs["graphed"];
  const auto last = [&](const std::string& n) { return (fs::path(dir) / n / "weights" / "last.pt").string(); };
  const WeightDiff tuned = weight_diff(last("tuned_a"), last("tuned_b"), "train_model");
  const WeightDiff again = weight_diff(last("eager"), last("eager_again"), "train_model");
  const WeightDiff d = weight_diff(last("eager"), last("graphed"), "train_model");
  std::printf("[ REPORT   ] 1 GPU, 8 steps through the trainer: two autotuned eager runs differ by %.2g (worst "
              "tensor %.2g); deterministic: eager vs eager %.2g, graphed vs eager %.2g (worst tensor %.2g, %s)\n",
              tuned.global, tuned.worst, again.global, d.global, d.worst, d.worst_name.c_str());
  EXPECT_EQ(again.global, 0.0);
  EXPECT_LE(d.global, 1e-4);
}

// The CUDA SyncBN paths of the fused node (NCHW: ATen's SyncBatchNorm kernels; channels_last: our
// fused kernels split around the all-reduce; both gather per-process rows [mean, invstd, count]
// with an all-reduce and combine them in one kernel), with a stats sync that
// plays a second process (its batch b and the gradient at its output): the node on batch a
// computes what BatchNorm over the concatenated batch computes for a's rows. One GPU is enough.
TEST(DistGpu, CudaSyncBnNormalisesWithTheGlobalBatch) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  using namespace libreyolo::models;
  const CudnnSettings fp32(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  struct OtherProcess : BnStatsSync {
    torch::Tensor zb, gb, gamma, beta, mean;
    double eps = 0;
    bool act = false;
    int stats_calls = 0, grad_calls = 0;
    int rank() const override { return 0; }
    int world_size() const override { return 2; }
    void all_reduce_sum(torch::Tensor& t) override {
      const int64_t C = zb.size(1);
      auto v = [](const torch::Tensor& x) { return x.view({1, -1, 1, 1}); };
      if (t.dim() == 2) {  // the rows [mean, invstd, count]: fill process 1's
        const double nb = static_cast<double>(zb.numel() / C);
        const auto mb = zb.mean({0, 2, 3});
        const auto vb = (zb - v(mb)).square().mean({0, 2, 3});
        t[1].narrow(0, 0, C).copy_(mb);
        t[1].narrow(0, C, C).copy_((vb + eps).rsqrt());
        t[1][2 * C].fill_(nb);
        const auto na = t[0][2 * C];
        mean = (t[0].narrow(0, 0, C) * na + mb * nb) / (na + nb);
        ++stats_calls;
      } else {  // [sum dy, sum dy*(z-mean)]
        // Process 1's BatchNorm output (for SiLU's backward) uses the global invstd, given below.
        const auto xmu = zb - v(mean);
        const auto g = act ? at::silu_backward(gb, xmu * v(global_invstd * gamma) + v(beta)) : gb;
        t.narrow(0, 0, C).add_(g.sum({0, 2, 3}));
        t.narrow(0, C, C).add_((g * xmu).sum({0, 2, 3}));
        ++grad_calls;
      }
    }
    torch::Tensor global_invstd;  // of both batches together (the test computes it)
  };
  const auto dev = torch::Device(torch::kCUDA, 0);
  // NCHW takes the ATen SyncBN kernels; channels_last (with 8 channels, the vector width) the
  // fused kernels split around the all-reduce. Both must give the global batch's BatchNorm.
  for (bool nhwc : {false, true})
  for (bool act : {false, true}) {
    SCOPED_TRACE(std::string(nhwc ? "fused kernels" : "ATen kernels") + (act ? ", SiLU" : ""));
    torch::manual_seed(11);
    const int64_t co = nhwc ? 8 : 6;
    const auto fmt = nhwc ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const auto a = torch::randn({2, 4, 6, 5}).to(dev).contiguous(fmt), b = torch::randn({3, 4, 6, 5}).to(dev).contiguous(fmt);
    const auto ga = torch::randn({2, co, 6, 5}).to(dev).contiguous(fmt), gb = torch::randn({3, co, 6, 5}).to(dev).contiguous(fmt);
    auto make_conv = [&] {
      torch::manual_seed(12);
      yolo9::Conv c(4, co, 3, 1, 1, act);
      {
        torch::NoGradGuard ng;
        c->bn->weight.uniform_(0.5, 1.5);
        c->bn->bias.uniform_(-0.5, 0.5);
      }
      c->to(dev);
      c->conv->weight.set_data(c->conv->weight.contiguous(fmt));
      c->train();
      return c;
    };
    set_fused_conv_training(false);  // reference: the composed ops over both batches
    auto ref = make_conv();
    auto x = torch::cat({a, b}).set_requires_grad(true);
    auto y_ref = ref->forward(x);
    y_ref.backward(torch::cat({ga, gb}));
    set_fused_conv_training(true);

    auto conv = make_conv();
    auto sync = std::make_shared<OtherProcess>();
    {
      torch::NoGradGuard ng;
      sync->zb = torch::conv2d(b, conv->conv->weight, {}, 1, 1);
      ASSERT_EQ(sync->zb.is_contiguous(at::MemoryFormat::ChannelsLast), nhwc);
      const auto za = torch::conv2d(a, conv->conv->weight, {}, 1, 1);
      const auto all = torch::cat({za, sync->zb});
      const auto var = all.var({0, 2, 3}, /*unbiased=*/false);
      sync->global_invstd = (var + conv->bn->options.eps()).rsqrt();
    }
    sync->gb = gb;
    sync->gamma = conv->bn->weight.detach();
    sync->beta = conv->bn->bias.detach();
    sync->eps = conv->bn->options.eps();
    sync->act = act;
    set_bn_stats_sync(sync);
    auto xa = a.clone().set_requires_grad(true);
    auto ya = conv->forward(xa);
    ya.backward(ga);
    set_bn_stats_sync(nullptr);
    EXPECT_EQ(sync->stats_calls, 1);
    EXPECT_EQ(sync->grad_calls, 1);
    EXPECT_LT(rel_err(ya, y_ref.slice(0, 0, 2)), 1e-4) << "act " << act;
    EXPECT_LT(rel_err(xa.grad(), x.grad().slice(0, 0, 2)), 1e-4) << "act " << act;
    EXPECT_LT(rel_err(conv->bn->running_mean, ref->bn->running_mean), 1e-5);
    EXPECT_LT(rel_err(conv->bn->running_var, ref->bn->running_var), 1e-5);
  }
}
