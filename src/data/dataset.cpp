#include "data/dataset.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>
#include <sstream>

#include "core/device.hpp"
#include "core/log.hpp"
#include "data/disk_cache.hpp"
#include "data/parallel.hpp"
#include "data/stage_timer.hpp"
#include "io/image.hpp"
#include "ops/image_ops.hpp"

namespace fs = std::filesystem;

namespace libreyolo::data {
namespace {

constexpr size_t kMaxListedProblems = 10;

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
}

bool parse_double(const std::string& token, double* out) {
  const char* b = token.data();
  const char* e = b + token.size();
  if (b != e && *b == '+') ++b;  // from_chars rejects an explicit plus sign
  const auto res = std::from_chars(b, e, *out);
  return res.ec == std::errc() && res.ptr == e && std::isfinite(*out);
}

// Logs the first few problems one by one and the rest as a count, so a broken dataset of
// 100k files does not drown the log.
void report_problems(const std::vector<std::string>& problems, const char* what) {
  for (size_t i = 0; i < problems.size() && i < kMaxListedProblems; ++i)
    log_warn(strfmt("%s: %s", what, problems[i].c_str()));
  if (problems.size() > kMaxListedProblems)
    log_warn(strfmt("%s: %zu more not listed", what, problems.size() - kMaxListedProblems));
}


}  // namespace

CacheMode cache_mode(const std::string& option) {
  if (option == "disk") return CacheMode::Disk;
  if (option == "ram" || option == "true" || option == "1" || option == "yes") return CacheMode::Ram;
  return CacheMode::None;
}

std::string label_path_for(const std::string& image_path) {
  const fs::path p(image_path);
  std::string dir = p.parent_path().string();
  replace_all(dir, "/images/", "/labels/");
  const std::string tail = "/images";
  if (dir.size() >= tail.size() && dir.compare(dir.size() - tail.size(), tail.size(), tail) == 0)
    dir.replace(dir.size() - tail.size(), tail.size(), "/labels");
  else if (dir == "images")
    dir = "labels";
  return (fs::path(dir) / p.stem()).string() + ".txt";
}

namespace {

// Normalised corners of a row, clipped to the image [0, 1]. Returns false when nothing of the
// box is left inside; sets *clipped when a coordinate was outside by more than rounding noise.
bool clip_unit_box(double& x1, double& y1, double& x2, double& y2, bool* clipped) {
  constexpr double kTolerance = 1e-6;  // written-out floats like 1.0000001 are not "outside"
  const double lo = std::min({x1, y1, x2, y2}), hi = std::max({x1, y1, x2, y2});
  *clipped = lo < -kTolerance || hi > 1.0 + kTolerance;
  x1 = std::clamp(x1, 0.0, 1.0);
  y1 = std::clamp(y1, 0.0, 1.0);
  x2 = std::clamp(x2, 0.0, 1.0);
  y2 = std::clamp(y2, 0.0, 1.0);
  return !(*clipped) || (x2 > x1 && y2 > y1);
}

}  // namespace

std::vector<Box> parse_label_file(const std::string& label_path, int w0, int h0, int num_classes,
                                  std::vector<std::string>* problems, int64_t* clipped_rows) {
  std::vector<Box> boxes;
  std::ifstream in(label_path);
  if (!in) return boxes;  // no label file: an image without objects
  std::string line;
  std::vector<std::string> tokens;
  std::vector<double> v;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    tokens.clear();
    std::istringstream ss(line);
    for (std::string t; ss >> t;) tokens.push_back(t);
    if (tokens.empty()) continue;
    auto problem = [&](const std::string& why) {
      if (problems) problems->push_back(strfmt("%s:%d: %s", label_path.c_str(), lineno, why.c_str()));
    };
    if (tokens.size() < 5) {
      problem(strfmt("%zu values, need at least 5 (class cx cy w h); row skipped", tokens.size()));
      continue;
    }
    v.resize(tokens.size());
    bool numeric = true;
    for (size_t k = 0; k < tokens.size() && numeric; ++k) numeric = parse_double(tokens[k], &v[k]);
    if (!numeric) {
      problem("not a row of finite numbers; row skipped");
      continue;
    }
    const double cls = v[0];
    if (cls < 0 || cls != std::floor(cls)) {
      problem(strfmt("class %g is not a non-negative integer; row skipped", cls));
      continue;
    }
    if (num_classes > 0 && cls >= num_classes) {
      problem(strfmt("class %g is out of range for nc=%d; row skipped", cls, num_classes));
      continue;
    }
    double x1, y1, x2, y2;  // normalised corners
    if (tokens.size() == 5) {
      if (v[3] < 0 || v[4] < 0) {
        problem(strfmt("negative box size (w %g, h %g); row skipped", v[3], v[4]));
        continue;
      }
      x1 = v[1] - v[3] / 2;
      y1 = v[2] - v[4] / 2;
      x2 = v[1] + v[3] / 2;
      y2 = v[2] + v[4] / 2;
    } else {
      if ((tokens.size() - 1) % 2 != 0) {
        problem("polygon with an odd number of coordinates; row skipped");
        continue;
      }
      x1 = x2 = v[1];
      y1 = y2 = v[2];
      for (size_t k = 3; k + 1 < v.size(); k += 2) {
        x1 = std::min(x1, v[k]);
        x2 = std::max(x2, v[k]);
        y1 = std::min(y1, v[k + 1]);
        y2 = std::max(y2, v[k + 1]);
      }
    }
    // Coordinates outside [0, 1] are clipped to the image; a box with nothing left inside is
    // dropped (Ultralytics refuses such labels; clipping keeps the usable part of a box that
    // merely overhangs the border).
    bool clipped = false;
    if (!clip_unit_box(x1, y1, x2, y2, &clipped)) {
      problem("box lies outside the image (coordinates outside [0, 1]); row skipped");
      continue;
    }
    if (clipped && clipped_rows) ++*clipped_rows;
    Box b;
    b.cls = cls;
    b.x1 = x1 * w0;
    b.y1 = y1 * h0;
    b.x2 = x2 * w0;
    b.y2 = y2 * h0;
    boxes.push_back(b);
  }
  return boxes;
}

torch::Tensor boxes_to_tensor(const std::vector<Box>& boxes) {
  auto t = torch::empty({static_cast<int64_t>(boxes.size()), 5}, torch::kFloat32);
  float* p = t.data_ptr<float>();
  for (const Box& b : boxes) {
    *p++ = static_cast<float>(b.x1);
    *p++ = static_cast<float>(b.y1);
    *p++ = static_cast<float>(b.x2);
    *p++ = static_cast<float>(b.y2);
    *p++ = static_cast<float>(b.cls);
  }
  return t;
}

YoloDataset::YoloDataset(const std::vector<std::string>& image_files, DatasetOptions options)
    : options_(options) {
  if (options_.imgsz <= 0) throw UsageError(strfmt("imgsz must be positive (got %d)", options_.imgsz));
  const int64_t n = static_cast<int64_t>(image_files.size());
  struct Scan {
    bool ok = false;
    std::string problem;
    int h0 = 0, w0 = 0;
    std::vector<Box> boxes;
    std::vector<std::string> label_problems;
    int64_t clipped = 0;  // label rows clipped to the image
  };
  std::vector<Scan> scans(static_cast<size_t>(n));
  parallel_for(n, options_.threads, [&](int64_t i) {
    Scan& s = scans[static_cast<size_t>(i)];
    const std::string& path = image_files[static_cast<size_t>(i)];
    try {
      const io::ImageSize sz = io::probe_image_size(path);
      if (sz.height <= 0 || sz.width <= 0) throw DataError("empty image");
      s.h0 = sz.height;
      s.w0 = sz.width;
    } catch (const Error& e) {
      s.problem = path + " (" + e.what() + ")";
      return;
    }
    s.boxes = parse_label_file(label_path_for(path), s.w0, s.h0, options_.num_classes,
                               &s.label_problems, &s.clipped);
    s.ok = true;
  });

  std::vector<std::string> image_problems, label_problems;
  int64_t clipped_files = 0;
  std::string first_clipped;
  for (int64_t i = 0; i < n; ++i) {
    Scan& s = scans[static_cast<size_t>(i)];
    label_problems.insert(label_problems.end(), s.label_problems.begin(), s.label_problems.end());
    if (s.clipped > 0) {
      labels_clipped_ += s.clipped;
      if (clipped_files++ == 0) first_clipped = label_path_for(image_files[static_cast<size_t>(i)]);
    }
    if (!s.ok) {
      image_problems.push_back(std::move(s.problem));
      continue;
    }
    Record r;
    r.path = image_files[static_cast<size_t>(i)];
    r.h0 = s.h0;
    r.w0 = s.w0;
    r.box_begin = boxes_.size();
    r.box_count = s.boxes.size();
    boxes_.insert(boxes_.end(), s.boxes.begin(), s.boxes.end());
    records_.push_back(std::move(r));
  }
  report_problems(label_problems, "label row skipped");
  labels_skipped_ = static_cast<int64_t>(label_problems.size());
  if (labels_skipped_ > 0)
    log_warn(strfmt("%lld label rows skipped (listed above)", static_cast<long long>(labels_skipped_)));
  // One summary line, not one per row: a dataset exported with a slightly different image size
  // can have thousands of overhanging boxes.
  if (labels_clipped_ > 0)
    log_warn(strfmt("%lld label rows in %lld files had coordinates outside [0, 1] and were clipped to "
                    "the image (first: %s)",
                    static_cast<long long>(labels_clipped_), static_cast<long long>(clipped_files),
                    first_clipped.c_str()));
  report_problems(image_problems, "corrupt image skipped");
  skipped_ = static_cast<int64_t>(image_problems.size());

  bad_.reset(new std::atomic<bool>[records_.size()]);
  for (size_t i = 0; i < records_.size(); ++i) bad_[i] = false;
  if (options_.cache == CacheMode::Ram && !records_.empty()) fill_cache();
  if (options_.cache == CacheMode::Disk && !records_.empty()) fill_disk_cache();

  if (skipped_ > 0)
    log_warn(strfmt("%lld of %lld images skipped as corrupt or unreadable",
                    static_cast<long long>(skipped_), static_cast<long long>(n)));
  if (records_.empty())
    throw DataError(strfmt("no usable images among %lld files", static_cast<long long>(n)),
                    "check that the image files are valid JPEG/PNG");
}

YoloDataset::~YoloDataset() = default;

void YoloDataset::fill_cache() {
  const int S = options_.imgsz;
  int64_t bytes = 0;
  for (const Record& r : records_) {
    const ops::FitBox f = ops::fit_box(r.h0, r.w0, S, options_.fit);
    bytes += f.height * f.width * 3;
  }
  const int64_t available = host_available_bytes();
  if (available > 0 && bytes > available * 9 / 10) {
    log_warn(strfmt("cache=ram needs %.2f GB but only %.2f GB is available; not caching",
                    bytes / 1e9, available / 1e9));
    return;
  }
  log_info(strfmt("Caching %zu images at imgsz %d in RAM (%.2f GB)", records_.size(), S,
                  bytes / 1e9));
  std::vector<torch::Tensor> cache(records_.size());
  std::vector<std::string> problems(records_.size());
  parallel_for(static_cast<int64_t>(records_.size()), options_.threads, [&](int64_t i) {
    try {
      cache[static_cast<size_t>(i)] = decode_resized(records_[static_cast<size_t>(i)]);
    } catch (const DataError& e) {
      problems[static_cast<size_t>(i)] = records_[static_cast<size_t>(i)].path + " (" + e.what() + ")";
    }
  });
  for (size_t i : drop_unreadable(problems)) cache_.push_back(std::move(cache[i]));
}

std::vector<size_t> YoloDataset::drop_unreadable(const std::vector<std::string>& problems) {
  // Undecodable images are dropped now, exactly like those whose header failed.
  std::vector<std::string> dropped;
  std::vector<Record> kept;
  std::vector<Box> kept_boxes;
  std::vector<size_t> kept_index;
  for (size_t i = 0; i < records_.size(); ++i) {
    if (!problems[i].empty()) {
      dropped.push_back(problems[i]);
      continue;
    }
    Record r = records_[i];
    r.box_begin = kept_boxes.size();
    kept_boxes.insert(kept_boxes.end(), boxes_.begin() + records_[i].box_begin,
                      boxes_.begin() + records_[i].box_begin + records_[i].box_count);
    kept.push_back(std::move(r));
    kept_index.push_back(i);
  }
  report_problems(dropped, "corrupt image skipped");
  skipped_ += static_cast<int64_t>(dropped.size());
  records_ = std::move(kept);
  boxes_ = std::move(kept_boxes);
  return kept_index;
}

void YoloDataset::fill_disk_cache() {
  const int S = options_.imgsz;
  // Which entries are missing or stale, and the room their files need.
  std::vector<char> valid(records_.size(), 0);
  parallel_for(static_cast<int64_t>(records_.size()), options_.threads, [&](int64_t i) {
    valid[static_cast<size_t>(i)] =
        read_disk_cache(records_[static_cast<size_t>(i)].path, S, options_.fit, options_.reduced_decode).has_value();
  });
  int64_t need = 0, missing = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    if (valid[i]) continue;
    const Record& r = records_[i];
    const ops::FitBox f = ops::fit_box(r.h0, r.w0, S, options_.fit);
    need += disk_cache_entry_bytes(static_cast<int>(f.height), static_cast<int>(f.width));
    ++missing;
  }
  if (missing > 0) {
    std::error_code ec;
    const auto dir = std::filesystem::path(records_.front().path).parent_path();
    const auto space = std::filesystem::space(dir, ec);
    if (!ec && static_cast<int64_t>(space.available) < need + need / 10) {
      log_warn(strfmt("cache=disk needs %.2f GB beside the images but only %.2f GB is free; not caching", need / 1e9,
                      static_cast<double>(space.available) / 1e9));
      return;
    }
    log_info(strfmt("Caching %lld of %zu images at imgsz %d on disk (%.2f GB, <image dir>/.libreyolo_cache)",
                    static_cast<long long>(missing), records_.size(), S, need / 1e9));
  } else {
    log_info(strfmt("cache=disk: all %zu images found in .libreyolo_cache at imgsz %d", records_.size(), S));
  }
  std::atomic<int64_t> failed{0};
  std::vector<std::string> problems(records_.size());
  parallel_for(static_cast<int64_t>(records_.size()), options_.threads, [&](int64_t i) {
    if (valid[static_cast<size_t>(i)]) return;
    const Record& r = records_[static_cast<size_t>(i)];
    const std::string& path = r.path;
    try {
      if (!write_disk_cache(path, S, decode_resized(r), options_.fit, options_.reduced_decode)) failed.fetch_add(1);
    } catch (const DataError& e) {
      problems[static_cast<size_t>(i)] = path + " (" + e.what() + ")";
    }
  });
  if (failed.load() > 0)
    log_warn(strfmt("cache=disk: %lld entries could not be written (read-only folder?); those images are decoded "
                    "each time",
                    static_cast<long long>(failed.load())));
  drop_unreadable(problems);
  disk_cache_ = true;
}

std::pair<int, int> YoloDataset::original_hw(int64_t i) const {
  const Record& r = records_.at(static_cast<size_t>(i));
  return {r.h0, r.w0};
}

std::vector<Box> YoloDataset::original_boxes(int64_t i) const {
  const Record& r = records_.at(static_cast<size_t>(i));
  return {boxes_.begin() + r.box_begin, boxes_.begin() + r.box_begin + r.box_count};
}

torch::Tensor YoloDataset::original_labels(int64_t i) const {
  return boxes_to_tensor(original_boxes(i));
}

torch::Tensor YoloDataset::decode_resized(const Record& r) const {
  const int S = options_.imgsz;
  // The decoded image is only an intermediate: it lives in this thread's reused memory, and the
  // result is always a tensor of its own (the resize's output, or a copy when no resize is
  // needed; a plain memcpy, as an ATen copy could start an OpenMP team in a loader thread).
  thread_local io::DecodeScratch scratch;
  torch::Tensor img;
  {
    StageScope timed(Stage::Decode);
    img = io::decode_image_for_size(r.path, options_.reduced_decode ? decode_target(r, S) : 0, scratch);
  }
  StageScope timed(Stage::Resize);
  // The size follows the header's, so that a reduced decode (whose sides libjpeg rounds up)
  // gives the same size as a full one, and mosaic tiles agree on it either way.
  const ops::FitBox f = ops::fit_box(r.h0, r.w0, S, options_.fit);
  if (img.size(0) == f.height && img.size(1) == f.width) {
    torch::Tensor out = torch::empty_like(img);
    std::memcpy(out.data_ptr<uint8_t>(), img.data_ptr<uint8_t>(), static_cast<size_t>(img.numel()));
    return out;
  }
  return ops::resize_bilinear(img, static_cast<int>(f.height), static_cast<int>(f.width));
}

int YoloDataset::decode_target(const Record& r, int side) const {
  if (options_.fit != ops::Fit::Stretch) return side;
  const int64_t lo = std::min<int64_t>(r.h0, r.w0), hi = std::max<int64_t>(r.h0, r.w0);
  return static_cast<int>(std::min<int64_t>(hi, (static_cast<int64_t>(side) * hi + lo - 1) / lo));
}

std::vector<Box> YoloDataset::boxes_at_imgsz(const Record& r, const ops::FitBox& fit) const {
  std::vector<Box> boxes(boxes_.begin() + static_cast<std::ptrdiff_t>(r.box_begin),
                         boxes_.begin() + static_cast<std::ptrdiff_t>(r.box_begin + r.box_count));
  for (Box& b : boxes) {
    b.x1 *= fit.sx;
    b.y1 *= fit.sy;
    b.x2 *= fit.sx;
    b.y2 *= fit.sy;
  }
  return boxes;
}

Sample YoloDataset::load_record(int64_t i) const {
  const Record& r = records_[static_cast<size_t>(i)];
  const int S = options_.imgsz;
  Sample s;
  if (!cache_.empty()) {
    s.image = cache_[static_cast<size_t>(i)];
  } else if (disk_cache_) {
    // The entry, unless the image changed since (or the entry is damaged): then decoded again
    // and the entry rewritten.
    auto cached = read_disk_cache(r.path, S, options_.fit, options_.reduced_decode);
    if (cached) {
      s.image = std::move(*cached);
    } else {
      s.image = decode_resized(r);
      write_disk_cache(r.path, S, s.image, options_.fit, options_.reduced_decode);
    }
  } else {
    s.image = decode_resized(r);
  }
  // Labels scale with the header size, as the reference does (PIL size, not decoded pixels).
  s.boxes = boxes_at_imgsz(r, ops::fit_box(r.h0, r.w0, S, options_.fit));
  return s;
}

Tile YoloDataset::load_tile_record(int64_t i, int slot, int need) const {
  const Record& r = records_[static_cast<size_t>(i)];
  const int S = options_.imgsz;
  const ops::FitBox f = ops::fit_box(r.h0, r.w0, S, options_.fit);
  if (cache_.empty() && !disk_cache_) {
    // The decode (at the DCT scale covering imgsz when reduced_decode is on) is not resized:
    // the mosaic samples it with resize_bilinear's taps, which is what resizing it first and
    // copying would give, in one pass instead of two.
    thread_local io::DecodeScratch scratch[kTileSlots];
    Tile t;
    {
      StageScope timed(Stage::Decode);
      t.image = io::decode_image_for_size(
          r.path, options_.reduced_decode ? decode_target(r, need > 0 ? std::min(need, S) : S) : 0, scratch[slot]);
    }
    t.height = static_cast<int>(f.height);
    t.width = static_cast<int>(f.width);
    t.boxes = boxes_at_imgsz(r, f);
    t.index = i;
    return t;
  }
  Sample s = load_record(i);
  Tile t;
  t.height = static_cast<int>(s.image.size(0));
  t.width = static_cast<int>(s.image.size(1));
  t.image = std::move(s.image);
  t.boxes = std::move(s.boxes);
  t.index = i;
  return t;
}

template <class Load>
auto YoloDataset::first_readable(int64_t i, Load&& load) const {
  const int64_t n = size();
  if (i < 0 || i >= n)
    throw UsageError(strfmt("dataset index %lld out of range [0, %lld)", static_cast<long long>(i),
                            static_cast<long long>(n)));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t j = (i + k) % n;
    if (bad_[j].load(std::memory_order_relaxed)) continue;
    try {
      return load(j);
    } catch (const DataError& e) {
      mark_unreadable(j, e.what());
    }
  }
  throw DataError("none of the dataset's images can be decoded");
}

void YoloDataset::mark_unreadable(int64_t j, const std::string& why) const {
  if (j < 0 || j >= size()) throw UsageError("mark_unreadable: index out of range");
  if (!bad_[j].exchange(true)) {
    ++unreadable_;
    log_warn(strfmt("corrupt image skipped: %s (%s); using the next image instead",
                    records_[static_cast<size_t>(j)].path.c_str(), why.c_str()));
  }
}

int64_t YoloDataset::readable_from(int64_t i) const {
  return first_readable(i, [](int64_t j) { return j; });
}

Tile YoloDataset::tile_geometry(int64_t i) const {
  const Record& r = records_.at(static_cast<size_t>(i));
  const ops::FitBox f = ops::fit_box(r.h0, r.w0, options_.imgsz, options_.fit);
  Tile t;
  t.height = static_cast<int>(f.height);
  t.width = static_cast<int>(f.width);
  t.boxes = boxes_at_imgsz(r, f);
  t.index = i;
  return t;
}

Sample YoloDataset::load_resized(int64_t i) const {
  return first_readable(i, [this](int64_t j) { return load_record(j); });
}

Tile YoloDataset::load_mosaic_tile(int64_t i, int slot, int need) const {
  if (slot < 0 || slot >= kTileSlots)
    throw UsageError(strfmt("load_mosaic_tile: slot %d outside [0, %d)", slot, kTileSlots));
  return first_readable(i, [this, slot, need](int64_t j) { return load_tile_record(j, slot, need); });
}

}  // namespace libreyolo::data
