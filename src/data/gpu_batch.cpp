#include "data/gpu_batch.hpp"
#include "core/env.hpp"

#include <chrono>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "data/stage_timer.hpp"
#include "io/image.hpp"

#if defined(LIBREYOLO_CUDA_KERNELS) && defined(LIBREYOLO_NVJPEG)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <nvjpeg.h>
#include <torch/cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/render.hpp"
#endif

namespace libreyolo::data {

std::shared_ptr<const std::vector<uint8_t>> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw DataError("cannot open " + path);
  const std::streamoff size = f.tellg();
  if (size < 0) throw DataError("cannot read " + path);
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(size));
  f.seekg(0);
  if (size > 0 && !f.read(reinterpret_cast<char*>(bytes->data()), size)) throw DataError("cannot read " + path);
  return bytes;
}

#if defined(LIBREYOLO_CUDA_KERNELS) && defined(LIBREYOLO_NVJPEG)

namespace {

// The nvJPEG entry points used here, from the library loaded at run time.
struct NvjpegApi {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegGetImageInfo) image_info = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_init = nullptr;
  decltype(&nvjpegDecodeBatched) batched = nullptr;
  std::string error;  // empty when everything was found
  std::string path;
};

NvjpegApi load_nvjpeg() {
  NvjpegApi a;
  std::vector<std::string> candidates;
  if (const char* env = env_get("LIBREYOLO_NVJPEG"); env && *env) candidates.emplace_back(env);
  candidates.emplace_back("libnvjpeg.so.13");
#ifdef LIBREYOLO_NVJPEG_DIR
  candidates.emplace_back(std::string(LIBREYOLO_NVJPEG_DIR) + "/libnvjpeg.so.13");
#endif
  candidates.emplace_back("/usr/local/cuda/lib64/libnvjpeg.so.13");
  candidates.emplace_back("libnvjpeg.so");
  void* lib = nullptr;
  std::string tried;
  for (const std::string& c : candidates) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      a.path = c;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + c;
  }
  if (!lib) {
    a.error = "libnvjpeg not found (tried " + tried + "; LIBREYOLO_NVJPEG may name the file)";
    return a;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && a.error.empty()) a.error = std::string(name) + " missing from " + a.path;
  };
  sym(a.create_ex, "nvjpegCreateEx");
  sym(a.destroy, "nvjpegDestroy");
  sym(a.state_create, "nvjpegJpegStateCreate");
  sym(a.state_destroy, "nvjpegJpegStateDestroy");
  sym(a.image_info, "nvjpegGetImageInfo");
  sym(a.decode, "nvjpegDecode");
  sym(a.batched_init, "nvjpegDecodeBatchedInitialize");
  sym(a.batched, "nvjpegDecodeBatched");
  return a;
}

const NvjpegApi& nvjpeg() {
  static const NvjpegApi a = load_nvjpeg();  // the library stays loaded for the process
  return a;
}

std::mutex start_totals_mu;
GpuBatchMaker::StartTimes start_totals;

void check(nvjpegStatus_t s, const char* what) {
  if (s != NVJPEG_STATUS_SUCCESS) throw RuntimeError(strfmt("nvJPEG: %s failed (status %d)", what, static_cast<int>(s)));
}

}  // namespace

bool gpu_loader_available(std::string* why) {
  const NvjpegApi& a = nvjpeg();
  if (!a.error.empty()) {
    if (why) *why = a.error;
    return false;
  }
  if (!torch::cuda::is_available()) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

struct GpuBatchMaker::Impl {
  int device = 0, S = 0;
  nvjpegHandle_t hw = nullptr, sw = nullptr;
  nvjpegJpegState_t hw_state = nullptr, sw_state = nullptr;
  int hw_batch = 0;
  std::string backend;
  std::optional<c10::cuda::CUDAStream> stream;
  std::mutex mu;
  std::atomic<int64_t> fallbacks{0};
  GpuBatchMaker::StartTimes start;
};

GpuBatchMaker::GpuBatchMaker(int device, int imgsz) : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!gpu_loader_available(&why)) throw RuntimeError("the GPU loader is unavailable: " + why);
  if (imgsz < 1) throw UsageError("GpuBatchMaker: imgsz must be positive");
  const NvjpegApi& a = nvjpeg();
  Impl& m = *impl_;
  m.device = device;
  m.S = imgsz;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  m.stream = c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device));
  // The GPU's JPEG engines where it has them (A100, H100/H200), for batched decoding; the hybrid
  // decoder for single images and as the batched decoder elsewhere.
  auto t = std::chrono::steady_clock::now();
  auto lap = [&t] {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - t).count();
    t = now;
    return ms;
  };
  if (a.create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &m.hw) == NVJPEG_STATUS_SUCCESS &&
      a.state_create(m.hw, &m.hw_state) == NVJPEG_STATUS_SUCCESS) {
    m.backend = "hardware";
  } else {
    if (m.hw) a.destroy(m.hw);
    m.hw = nullptr;
    m.backend = "cuda";
  }
  m.start.hardware_ms = lap();
  check(a.create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &m.sw), "nvjpegCreateEx");
  check(a.state_create(m.sw, &m.sw_state), "nvjpegJpegStateCreate");
  m.start.hybrid_ms = lap();
  std::lock_guard<std::mutex> lock(start_totals_mu);
  start_totals.hardware_ms += m.start.hardware_ms;
  start_totals.hybrid_ms += m.start.hybrid_ms;
}

GpuBatchMaker::~GpuBatchMaker() {
  const NvjpegApi& a = nvjpeg();
  Impl& m = *impl_;
  if (m.stream) m.stream->synchronize();
  if (m.hw_state) a.state_destroy(m.hw_state);
  if (m.hw) a.destroy(m.hw);
  if (m.sw_state) a.state_destroy(m.sw_state);
  if (m.sw) a.destroy(m.sw);
}

std::string GpuBatchMaker::backend() const { return impl_->backend; }
int64_t GpuBatchMaker::cpu_fallbacks() const { return impl_->fallbacks.load(); }
GpuBatchMaker::StartTimes GpuBatchMaker::start_times() const { return impl_->start; }

GpuBatchMaker::StartTimes gpu_batch_maker_start_totals() {
  std::lock_guard<std::mutex> lock(start_totals_mu);
  return start_totals;
}

// One file to decode and, once decoded, its image.
struct GpuBatchMaker::Entry {
  const std::vector<uint8_t>* bytes = nullptr;
  int64_t index = -1;  // reported with a failure
  const std::string* name = nullptr;
  torch::Tensor image;  // [h, w, 3] uint8 on the device once decoded
};

// Decodes every entry on the maker's stream (nvJPEG; the CPU's decoder for what it cannot read)
// and waits for it; files neither reads go to *bad. The caller holds the lock and the guards.
void GpuBatchMaker::decode_entries(std::vector<Entry>& entries, std::vector<std::pair<int64_t, std::string>>* bad) {
  const NvjpegApi& a = nvjpeg();
  Impl& m = *impl_;
  const cudaStream_t stream = m.stream->stream();
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, m.device);
  StageScope timed(Stage::GpuDecode);
  // The CPU's decoder for what nvJPEG cannot read; a file neither reads is corrupt.
  auto on_cpu = [&](Entry& e) {
    try {
      const torch::Tensor img = io::decode_image_bytes(e.bytes->data(), e.bytes->size(), *e.name);
      e.image = img.to(u8.device());
      ++m.fallbacks;
    } catch (const DataError& err) {
      bad->emplace_back(e.index, err.what());
    }
  };
  std::vector<size_t> gpu;
  std::vector<const unsigned char*> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> dest;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    int nc = 0, widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
    nvjpegChromaSubsampling_t css{};
    const bool ok = a.image_info(m.sw, e.bytes->data(), e.bytes->size(), &nc, &css, widths, heights) ==
                        NVJPEG_STATUS_SUCCESS &&
                    nc == 3 && widths[0] > 0 && heights[0] > 0 &&
                    static_cast<int64_t>(widths[0]) * heights[0] <= (int64_t{1} << 28) && css != NVJPEG_CSS_410 &&
                    css != NVJPEG_CSS_411 && css != NVJPEG_CSS_410V && css != NVJPEG_CSS_UNKNOWN;
    // nvJPEG may return a truncated file's missing rows as grey; the CPU decoder refuses it
    // (io/image.hpp), so a file without its end-of-image marker goes there.
    bool ends = false;
    const size_t len = e.bytes->size();
    for (size_t j = len >= 64 ? len - 64 : 0; j + 1 < len && !ends; ++j)
      ends = (*e.bytes)[j] == 0xFF && (*e.bytes)[j + 1] == 0xD9;
    if (!ok || !ends) {
      on_cpu(e);
      continue;
    }
    e.image = torch::empty({heights[0], widths[0], 3}, u8);
    nvjpegImage_t img{};
    img.channel[0] = e.image.data_ptr<uint8_t>();
    img.pitch[0] = static_cast<size_t>(widths[0]) * 3;
    gpu.push_back(i);
    data.push_back(e.bytes->data());
    lengths.push_back(e.bytes->size());
    dest.push_back(img);
  }
  bool decoded = false;
  if (m.hw && !gpu.empty()) {
    const int n = static_cast<int>(gpu.size());
    if (m.hw_batch != n) {
      check(a.batched_init(m.hw, m.hw_state, n, 1, NVJPEG_OUTPUT_RGBI), "nvjpegDecodeBatchedInitialize");
      m.hw_batch = n;
    }
    decoded = a.batched(m.hw, m.hw_state, data.data(), lengths.data(), dest.data(), stream) == NVJPEG_STATUS_SUCCESS;
  }
  if (!decoded)  // no JPEG engine, or a file the engine refused: one at a time
    for (size_t j = 0; j < gpu.size(); ++j)
      if (a.decode(m.sw, m.sw_state, data[j], lengths[j], NVJPEG_OUTPUT_RGBI, &dest[j], stream) !=
          NVJPEG_STATUS_SUCCESS)
        on_cpu(entries[gpu[j]]);
  m.stream->synchronize();
}

std::vector<torch::Tensor> GpuBatchMaker::decode(const std::vector<std::shared_ptr<const std::vector<uint8_t>>>& files,
                                                 const std::vector<std::string>& names,
                                                 std::vector<std::pair<int64_t, std::string>>* bad) {
  if (files.size() != names.size()) throw UsageError("GpuBatchMaker::decode: a name per file");
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  c10::cuda::CUDAStreamGuard stream_guard(*m.stream);
  bad->clear();
  std::vector<Entry> entries;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!files[i]) throw UsageError("GpuBatchMaker::decode: a file without bytes");
    entries.push_back({files[i].get(), static_cast<int64_t>(i), &names[i], {}});
  }
  decode_entries(entries, bad);
  std::vector<torch::Tensor> out;
  for (auto& e : entries) out.push_back(std::move(e.image));
  return out;
}

torch::Tensor GpuBatchMaker::make(const std::vector<PlannedSample>& samples,
                                  std::vector<std::pair<int64_t, std::string>>* bad) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  c10::cuda::CUDAStreamGuard stream_guard(*m.stream);
  const cudaStream_t stream = m.stream->stream();
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8).device(torch::kCUDA, m.device);
  bad->clear();

  std::vector<Entry> entries;
  for (const PlannedSample& s : samples)
    for (int k = 0; k < s.plan.num_tiles; ++k) {
      const auto& f = s.files[static_cast<size_t>(k)];
      if (!f) throw UsageError("GpuBatchMaker: a tile has no file bytes");
      entries.push_back({f.get(), s.plan.tiles[static_cast<size_t>(k)].index, &s.names[static_cast<size_t>(k)], {}});
    }
  decode_entries(entries, bad);
  if (!bad->empty()) return {};

  StageScope timed(Stage::GpuDraw);
  const int n = static_cast<int>(samples.size());
  torch::Tensor desc = torch::empty({static_cast<int64_t>(n * sizeof(kernels::RenderSample))},
                                    torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  auto* d = reinterpret_cast<kernels::RenderSample*>(desc.data_ptr<uint8_t>());
  size_t e = 0;
  for (int j = 0; j < n; ++j) {
    const SampleDraw& p = samples[static_cast<size_t>(j)].plan;
    kernels::RenderSample r{};
    r.num_tiles = p.num_tiles;
    r.canvas_w = p.canvas_w;
    r.canvas_h = p.canvas_h;
    r.warp = p.warp;
    r.r00 = p.map.r00, r.r01 = p.map.r01, r.r10 = p.map.r10, r.r11 = p.map.r11, r.tx = p.map.tx, r.ty = p.map.ty;
    r.content_w = p.content_w;
    r.content_h = p.content_h;
    r.hsv = p.hsv;
    r.flip = p.flip;
    r.gain_h = ((p.gains.h % 180) + 180) % 180;
    r.gain_s = p.gains.s;
    r.gain_v = p.gains.v;
    for (int k = 0; k < p.num_tiles; ++k, ++e) {
      const TileDraw& t = p.tiles[static_cast<size_t>(k)];
      const torch::Tensor& img = entries[e].image;
      r.tiles[k] = {img.data_ptr<uint8_t>(), static_cast<int>(img.size(1)), static_cast<int>(img.size(0)),
                    t.tile_w, t.tile_h, t.offset_x, t.offset_y, t.x1, t.y1, t.x2, t.y2};
    }
    d[j] = r;
  }
  const torch::Tensor desc_dev = desc.to(u8.device(), /*non_blocking=*/true);
  torch::Tensor out = torch::empty({n, m.S, m.S, 3}, u8);
  kernels::render_samples(reinterpret_cast<const kernels::RenderSample*>(desc_dev.data_ptr<uint8_t>()), n, m.S,
                          out.data_ptr<uint8_t>(), stream);
  m.stream->synchronize();
  return out;
}

#else  // no CUDA kernels or no nvjpeg.h at build time

bool gpu_loader_available(std::string* why) {
  if (why) {
#if !defined(LIBREYOLO_CUDA_KERNELS)
    *why = "this build has no CUDA kernels";
#else
    *why = "this build found no nvjpeg.h (install the CUDA toolkit's nvJPEG or the nvidia-nvjpeg wheel and rebuild)";
#endif
  }
  return false;
}

struct GpuBatchMaker::Impl {};

GpuBatchMaker::GpuBatchMaker(int, int) {
  std::string why;
  gpu_loader_available(&why);
  throw RuntimeError("the GPU loader is unavailable: " + why);
}
GpuBatchMaker::~GpuBatchMaker() = default;
std::vector<torch::Tensor> GpuBatchMaker::decode(const std::vector<std::shared_ptr<const std::vector<uint8_t>>>&,
                                                 const std::vector<std::string>&,
                                                 std::vector<std::pair<int64_t, std::string>>*) {
  throw RuntimeError("the GPU loader is unavailable");
}
struct GpuBatchMaker::Entry {};
void GpuBatchMaker::decode_entries(std::vector<Entry>&, std::vector<std::pair<int64_t, std::string>>*) {}
torch::Tensor GpuBatchMaker::make(const std::vector<PlannedSample>&, std::vector<std::pair<int64_t, std::string>>*) {
  throw RuntimeError("the GPU loader is unavailable");
}
std::string GpuBatchMaker::backend() const { return ""; }
int64_t GpuBatchMaker::cpu_fallbacks() const { return 0; }
GpuBatchMaker::StartTimes GpuBatchMaker::start_times() const { return {}; }
GpuBatchMaker::StartTimes gpu_batch_maker_start_totals() { return {}; }

#endif

}  // namespace libreyolo::data
