// The fused BatchNorm + SiLU kernels (src/kernels/bn_act.cu) one shape at a time, printed as JSON:
// GPU time per launch of each of the four kernels, and the effective bandwidth, against a plain
// device-to-device copy of the same activation (the memory system's pace for these bytes).
//
//   bench_bn_act [--batch 16] [--channels 16,32,64,128,256] [--sides 320,160,80,40,20]
//                [--dtype bf16|fp16|fp32] [--grids auto,old,c8r16,c32p256] [--vecs 4,8]
//                [--launches 20] [--reps 5]
//
// Each timing replays a CUDA graph of `launches` back-to-back launches (as the captured training
// step runs them: no host launch cost) `reps` times and keeps the fastest replay. --grids sweeps
// the reductions' grid: "rule" = the training step's choice for the shape (bn_act_reduce_grid_for());
// "auto" = the kernels' fallback (bn_act_row_blocks() with 0s); "old" = 32 channel
// groups per block, 4 rows per thread (the defaults as of 2026-12-01); "c<G>r<R>" = G channel groups per block, R rows per
// thread; "c<G>p<P>" = G groups, P row-blocks (clamped to the bound of 1024 / channel blocks).
// CUDA only.
#include <torch/torch.h>

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include "kernels/bn_act.hpp"
#endif

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace libreyolo {
namespace {

struct Options {
  int64_t batch = 16;
  std::vector<int64_t> channels = {16, 32, 64, 128, 256};
  std::vector<int64_t> sides = {320, 160, 80, 40, 20};
  std::string dtype = "bf16";
  std::vector<std::string> grids = {"auto"};
  std::vector<int64_t> vecs;  // empty: the kernels' own choice
  int launches = 20;
  int reps = 5;
};

using bench::split;
using bench::split_ints;

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--batch") o.batch = std::stoll(next());
    else if (a == "--channels") o.channels = split_ints(next());
    else if (a == "--sides") o.sides = split_ints(next());
    else if (a == "--dtype") o.dtype = next();
    else if (a == "--grids") o.grids = split(next());
    else if (a == "--vecs") o.vecs = split_ints(next());
    else if (a == "--launches") o.launches = std::stoi(next());
    else if (a == "--reps") o.reps = std::stoi(next());
    else throw std::invalid_argument("unknown argument " + a);
  }
  if (o.dtype != "bf16" && o.dtype != "fp16" && o.dtype != "fp32")
    throw std::invalid_argument("--dtype must be bf16, fp16 or fp32");
  if (o.launches < 1 || o.reps < 1 || o.batch < 1) throw std::invalid_argument("--launches, --reps, --batch: >= 1");
  return o;
}

#ifdef LIBREYOLO_CUDA_KERNELS
// Microseconds per call of `body` (bench::graph_time_us: the fastest replay of a graph of
// `launches` calls).
double time_us(const std::function<void()>& body, const Options& o) {
  return bench::graph_time_us(body, o.launches, o.reps, /*warm=*/1);
}

nlohmann::json bench_shape(const Options& o, int64_t c, int64_t side) {
  const auto dev = torch::Device(torch::kCUDA, 0);
  const auto st = o.dtype == "bf16" ? torch::kBFloat16 : o.dtype == "fp16" ? torch::kHalf : torch::kFloat;
  const auto kd = o.dtype == "bf16"   ? libreyolo::kernels::DType::BFloat16
                  : o.dtype == "fp16" ? libreyolo::kernels::DType::Float16
                                      : libreyolo::kernels::DType::Float32;
  const int64_t rows = o.batch * side * side;
  auto opts = torch::TensorOptions().device(dev);
  torch::Tensor x = torch::randn({rows, c}, opts.dtype(st)) * 2 + 0.5;
  torch::Tensor dy = torch::randn({rows, c}, opts.dtype(st));
  torch::Tensor y = torch::empty_like(x), dx = torch::empty_like(x), copy = torch::empty_like(x);
  auto f32 = opts.dtype(torch::kFloat);
  torch::Tensor gamma = torch::rand({c}, f32) + 0.5, beta = torch::randn({c}, f32);
  torch::Tensor rmean = torch::zeros({c}, f32), rvar = torch::ones({c}, f32);
  torch::Tensor stats = torch::empty({2 * c}, f32), dsum = torch::empty({2 * c}, f32);
  torch::Tensor dg = torch::empty({c}, f32), db = torch::empty({c}, f32);
  torch::Tensor counters = torch::zeros({libreyolo::kernels::bn_act_max_counters()}, opts.dtype(torch::kInt));
  torch::Tensor partials = torch::empty({3 * libreyolo::kernels::bn_act_max_partials_per_plane() + 3 * c}, f32);
  auto* cnt = reinterpret_cast<unsigned*>(counters.data_ptr<int>());

  libreyolo::kernels::BnActLaunch l;
  l.rows = rows;
  l.channels = static_cast<int>(c);
  l.dtype = kd;
  l.act = true;
  l.vec = libreyolo::kernels::bn_act_vector_width(l.channels);
  const int auto_blocks = libreyolo::kernels::bn_act_row_blocks(rows, l.channels, l.vec);
  const double mb = static_cast<double>(x.numel()) * x.element_size() / 1e6;

  nlohmann::json out = {{"channels", c}, {"side", side}, {"rows", rows}, {"activation_mb", mb},
                        {"vec", l.vec}, {"auto_row_blocks", auto_blocks}};
  out["copy_us"] = time_us(
      [&] {
        cudaMemcpyAsync(copy.data_ptr(), x.data_ptr(), x.numel() * x.element_size(), cudaMemcpyDeviceToDevice,
                        c10::cuda::getCurrentCUDAStream().stream());
      },
      o);
  out["copy_gbps"] = 2 * mb / 1e3 / (out["copy_us"].get<double>() / 1e6);
  std::vector<int64_t> vecs = o.vecs;
  if (vecs.empty()) vecs.push_back(l.vec);
  for (const int64_t vec : vecs) {
  for (const std::string& grid : o.grids) {
    if (vec != 1 && c % vec != 0) continue;
    l.vec = static_cast<int>(vec);
    l.block_groups = 0;
    l.row_blocks = libreyolo::kernels::bn_act_row_blocks(rows, l.channels, l.vec);
    if (grid == "rule") {  // what a training step uses for this shape
      const auto g = libreyolo::kernels::bn_act_reduce_grid_for(rows, l.channels, l.vec);
      l.block_groups = g.block_groups;
      l.row_blocks = libreyolo::kernels::bn_act_row_blocks(rows, l.channels, l.vec, g.block_groups, g.rows_per_thread);
    } else if (grid == "old") {
      l.block_groups = 32;
      l.row_blocks = libreyolo::kernels::bn_act_row_blocks(rows, l.channels, l.vec, 32, 4);
    } else if (grid != "auto") {
      const size_t at = grid.find_first_of("rp", 1);
      if (grid.empty() || grid[0] != 'c' || at == std::string::npos)
        throw std::invalid_argument("--grids: rule, auto, old, c<G>r<R> or c<G>p<P>, not " + grid);
      l.block_groups = std::stoi(grid.substr(1, at - 1));
      const int v = std::stoi(grid.substr(at + 1));
      const int cb = libreyolo::kernels::bn_act_counters(l.channels, l.vec, l.block_groups);
      l.row_blocks = grid[at] == 'r' ? libreyolo::kernels::bn_act_row_blocks(rows, l.channels, l.vec, l.block_groups, v)
                                     : std::clamp(v, 1, std::max(1, 1024 / cb));
    }
    l.stream = nullptr;
    auto stream_of = [&] {
      auto m = l;
      m.stream = c10::cuda::getCurrentCUDAStream().stream();
      return m;
    };
    float* mean = stats.data_ptr<float>();
    const double fwd = time_us(
        [&] {
          libreyolo::kernels::bn_act_forward(stream_of(), x.data_ptr(), gamma.data_ptr<float>(),
                                             beta.data_ptr<float>(), rmean.data_ptr<float>(), rvar.data_ptr<float>(),
                                             0.03f, 1e-3f, partials.data_ptr<float>(), cnt, mean, mean + c,
                                             y.data_ptr());
        },
        o);
    const double red = time_us(
        [&] {
          libreyolo::kernels::bn_act_backward_reduce(stream_of(), dy.data_ptr(), x.data_ptr(),
                                                     gamma.data_ptr<float>(), beta.data_ptr<float>(), mean, mean + c,
                                                     partials.data_ptr<float>(), cnt, dsum.data_ptr<float>(),
                                                     dg.data_ptr<float>(), db.data_ptr<float>(), false);
        },
        o);
    const double elemt = time_us(
        [&] {
          libreyolo::kernels::bn_act_backward_elemt(stream_of(), dy.data_ptr(), x.data_ptr(),
                                                    gamma.data_ptr<float>(), beta.data_ptr<float>(), mean, mean + c,
                                                    dsum.data_ptr<float>(), nullptr, dx.data_ptr());
        },
        o);
    // The statistics launch alone: local_stats is the same kernel writing a row instead.
    torch::Tensor row = torch::zeros({2 * c + 1}, f32);
    const double stats_only = time_us(
        [&] {
          libreyolo::kernels::bn_act_local_stats(stream_of(), x.data_ptr(), 1e-3f, partials.data_ptr<float>(), cnt,
                                                 row.data_ptr<float>());
        },
        o);
    out["runs"].push_back({{"grid", grid},
                           {"vec", l.vec},
                           {"block_groups", l.block_groups},
                           {"channel_blocks", libreyolo::kernels::bn_act_counters(l.channels, l.vec, l.block_groups)},
                           {"row_blocks", l.row_blocks},
                           {"stats_us", stats_only},
                           {"apply_us", fwd - stats_only},
                           {"forward_us", fwd},
                           {"backward_reduce_us", red},
                           {"backward_elemt_us", elemt},
                           {"stats_gbps", mb / 1e3 / (stats_only / 1e6)},
                           {"backward_reduce_gbps", 2 * mb / 1e3 / (red / 1e6)},
                           {"backward_elemt_gbps", 3 * mb / 1e3 / (elemt / 1e6)}});
  }
  }
  return out;
}
#endif

}  // namespace
}  // namespace libreyolo

using namespace libreyolo;

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
#ifdef LIBREYOLO_CUDA_KERNELS
    if (!torch::cuda::is_available()) {
      std::cerr << "bench_bn_act: needs a CUDA device\n";
      return 2;
    }
    nlohmann::json out = {{"bench", "bn_act"}, {"batch", o.batch}, {"dtype", o.dtype}, {"launches", o.launches}};
    for (int64_t c : o.channels)
      for (int64_t s : o.sides) out["shapes"].push_back(bench_shape(o, c, s));
    std::cout << out.dump(1) << "\n";
    return 0;
#else
    std::cerr << "bench_bn_act: built without the CUDA kernels\n";
    return 2;
#endif
  } catch (const std::exception& e) {
    std::cerr << "bench_bn_act: " << e.what() << "\n";
    return 2;
  }
}
