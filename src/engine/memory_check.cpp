#include "engine/memory_check.hpp"

#include <ATen/Parallel.h>
#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "core/device.hpp"
#include "core/log.hpp"
#include "core/strings.hpp"
#include "engine/model_snapshot.hpp"

namespace libreyolo::engine {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The backward holds the forward's saved activations while it makes their gradients: the step's
// peak is about this multiple of the forward's growth (the smallest detector, batch 4 at 640 px on the CPU: a
// peak resident size of 2.3 GiB against a forward growth of 1.35 GiB).
constexpr double kBackwardFactor = 1.7;

double heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
}

double forward_growth(models::Detector& model, int size) {
  const auto x = torch::zeros({1, 3, size, size});
  const double before = heap_in_use();
  const auto out = model.forward_train(x, {});
  return heap_in_use() - before;
}

}  // namespace

double host_available_gib() {
  const int64_t bytes = host_available_bytes();
  return bytes > 0 ? static_cast<double>(bytes) / kGiB : 0.0;
}

// At most kMeasureThreads intra-op threads while measuring (restored after): the growth does not
// depend on them, and several trainings starting at once on one host, each with a thread per core,
// took minutes over five small forwards.
namespace {
constexpr int kMeasureThreads = 4;
struct ThreadCap {
  int before = at::get_num_threads();
  explicit ThreadCap(int cap) {
    if (before > cap) at::set_num_threads(cap);
  }
  ~ThreadCap() {
    if (at::get_num_threads() != before) at::set_num_threads(before);
  }
};
}  // namespace

double cpu_activation_bytes_per_pixel(models::Detector& model) {
  // 128 and 192 px, or from the network's smallest input up (a query-selecting decoder needs a
  // few hundred positions).
  const int small_side = static_cast<int>(std::max<int64_t>(128, (model.min_input_size() + 31) / 32 * 32));
  const int large_side = small_side + 64;
  const ThreadCap threads(kMeasureThreads);
  ModelStateSnapshot snapshot(model);
  double per_pixel = 0;
  try {
    torch::AutoGradMode grad(true);
    model.train();
    forward_growth(model, small_side);  // first use: lazily made buffers, thread pools
    // The smaller of two tries each: a loader thread allocating meanwhile only adds.
    const double small = std::min(forward_growth(model, small_side), forward_growth(model, small_side));
    const double large = std::min(forward_growth(model, large_side), forward_growth(model, large_side));
    per_pixel = std::max(0.0, (large - small) / (double(large_side) * large_side - double(small_side) * small_side));
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  model.zero_grad(/*set_to_none=*/true);
  return per_pixel;
}

namespace {
// float32 weights, gradients, momentum (Adam: two moments) and the EMA's copy, in bytes.
double training_state_bytes(models::Detector& model) {
  int64_t params = 0;
  for (const auto& p : models::unique_named_parameters(model)) params += p.second.numel();
  return static_cast<double>(params) * 4.0 * 5.0;
}
}  // namespace

MemoryEstimate estimate_cpu_training_memory(models::Detector& model, int batch, int imgsz, int workers) {
  MemoryEstimate e;
  const double pixels = static_cast<double>(imgsz) * imgsz;
  e.activations_gib = cpu_activation_bytes_per_pixel(model) * pixels * batch * kBackwardFactor / kGiB;
  const double state = training_state_bytes(model);
  // Each loader thread builds a batch of uint8 images (a mosaic canvas is 4x the pixels).
  const double loader = static_cast<double>(std::max(workers, 1) + 2) * batch * pixels * 3.0 * 4.0;
  e.fixed_gib = (state + loader) / kGiB;
  e.available_gib = host_available_gib();
  return e;
}

MemoryEstimate estimate_cuda_training_memory(double activation_bytes_per_pixel, models::Detector& model, int batch,
                                             int imgsz, bool amp, const torch::Device& device) {
  MemoryEstimate e;
  const double pixels = static_cast<double>(imgsz) * imgsz;
  e.activations_gib =
      activation_bytes_per_pixel * (amp ? 0.5 : 1.0) * pixels * batch * kBackwardFactor / kGiB;
  // The state, and the batch's float32 input.
  e.fixed_gib = (training_state_bytes(model) + static_cast<double>(batch) * pixels * 3.0 * 4.0) / kGiB;
  e.available_gib = device_free_gib(device);
  e.where = device.str();
  return e;
}

double device_free_gib(const torch::Device& device) {
  if (!device.is_cuda()) return 0.0;
  const int64_t bytes = device_free_bytes(device.index() < 0 ? 0 : device.index());
  return bytes > 0 ? static_cast<double>(bytes) / kGiB : 0.0;
}

void check_memory_fits(const MemoryEstimate& e, int batch, int imgsz) {
  const bool device = !e.where.empty();
  const std::string what = strfmt("one training step of batch %d at imgsz %d needs about %.1f GiB%s (activations %.1f GiB, "
                                  "%s %.1f GiB)",
                                  batch, imgsz, e.need_gib(), device ? (" on " + e.where).c_str() : "",
                                  e.activations_gib, device ? "weights, optimizer and input" : "weights, optimizer and loader",
                                  e.fixed_gib);
  if (e.available_gib <= 0) {
    log_info("Memory: " + what + "; the available memory is unknown");
    return;
  }
  if (device) {
    const std::string have = strfmt("%.1f GiB free there", e.available_gib);
    if (e.need_gib() > 0.8 * e.available_gib)
      log_warn("GPU memory may not suffice: " + what + ", " + have +
               " (a step that does not fit stops with cuda_oom; batch=-1 picks a batch that fits)");
    else
      log_info("GPU memory: " + what + ", " + have);
    return;
  }
  const std::string have = strfmt("%.1f GiB available", e.available_gib);
  if (e.need_gib() > e.available_gib)
    throw UsageError("Not enough memory: " + what + ", " + have, "Lower batch or imgsz.", "out_of_memory");
  if (e.need_gib() > 0.8 * e.available_gib)
    log_warn("Memory is tight: " + what + ", " + have + " (lower batch or imgsz if the run is killed)");
  else
    log_info("Memory: " + what + ", " + have);
}

}  // namespace libreyolo::engine
