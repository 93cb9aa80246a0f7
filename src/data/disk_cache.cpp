#include "data/disk_cache.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace libreyolo::data {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'L', 'Y', 'R', 'G', 'B', '0', '0', '1'};

// Little-endian fixed layout, 40 bytes.
struct Header {
  char magic[8];
  int64_t src_size;
  int64_t src_mtime;  // file_time_type ticks
  int32_t h, w, imgsz;
  int32_t fit;  // bit 0: 0 letterbox size, 1 stretch; bit 1: a full decode
};
static_assert(sizeof(Header) == 40, "disk cache header layout");

bool source_stamp(const std::string& path, int64_t* size, int64_t* mtime) {
  std::error_code ec;
  const auto sz = fs::file_size(path, ec);
  if (ec) return false;
  const auto t = fs::last_write_time(path, ec);
  if (ec) return false;
  *size = static_cast<int64_t>(sz);
  *mtime = static_cast<int64_t>(t.time_since_epoch().count());
  return true;
}

int32_t fit_code(ops::Fit fit, bool reduced_decode) {
  return (fit == ops::Fit::Stretch ? 1 : 0) | (reduced_decode ? 0 : 2);
}

}  // namespace

std::string disk_cache_path(const std::string& image_path, int imgsz, ops::Fit fit, bool reduced_decode) {
  const fs::path p(image_path);
  const std::string suffix =
      std::string(fit == ops::Fit::Stretch ? ".stretch" : "") + (reduced_decode ? "" : ".full") + ".rgb";
  return (p.parent_path() / ".libreyolo_cache" / (p.filename().string() + "." + std::to_string(imgsz) + suffix))
      .string();
}

int64_t disk_cache_entry_bytes(int h, int w) {
  return static_cast<int64_t>(sizeof(Header)) + static_cast<int64_t>(h) * w * 3;
}

std::optional<torch::Tensor> read_disk_cache(const std::string& image_path, int imgsz, ops::Fit fit,
                                             bool reduced_decode) {
  int64_t size = 0, mtime = 0;
  if (!source_stamp(image_path, &size, &mtime)) return std::nullopt;
  const std::string path = disk_cache_path(image_path, imgsz, fit, reduced_decode);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  Header h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof h)) return std::nullopt;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.src_size != size || h.src_mtime != mtime ||
      h.imgsz != imgsz || h.fit != fit_code(fit, reduced_decode) || h.h < 1 || h.w < 1 || h.h > imgsz || h.w > imgsz)
    return std::nullopt;
  std::error_code ec;
  if (static_cast<int64_t>(fs::file_size(path, ec)) != disk_cache_entry_bytes(h.h, h.w) || ec) return std::nullopt;
  torch::Tensor img = torch::empty({h.h, h.w, 3}, torch::kUInt8);
  if (!in.read(reinterpret_cast<char*>(img.data_ptr<uint8_t>()), static_cast<std::streamsize>(img.numel())))
    return std::nullopt;
  return img;
}

bool write_disk_cache(const std::string& image_path, int imgsz, const torch::Tensor& hwc, ops::Fit fit,
                      bool reduced_decode) {
  if (!hwc.defined() || hwc.dim() != 3 || hwc.size(2) != 3 || hwc.scalar_type() != torch::kUInt8) return false;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  if (!source_stamp(image_path, &h.src_size, &h.src_mtime)) return false;
  h.h = static_cast<int32_t>(hwc.size(0));
  h.w = static_cast<int32_t>(hwc.size(1));
  h.imgsz = imgsz;
  h.fit = fit_code(fit, reduced_decode);
  const fs::path path = disk_cache_path(image_path, imgsz, fit, reduced_decode);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) return false;
  // A name no other writer (thread or process) uses, renamed into place.
  static std::atomic<uint64_t> counter{0};
  const auto tag = std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) + "." +
                   std::to_string(counter.fetch_add(1)) + "." +
                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  const fs::path tmp = path.string() + ".tmp." + tag;
  const torch::Tensor c = hwc.contiguous();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), static_cast<std::streamsize>(c.numel()));
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace libreyolo::data
