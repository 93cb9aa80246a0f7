// A detection dataset in the YOLO layout: image files plus labels/*.txt (LibreYOLO's YOLODataset).
#pragma once
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/image_ops.hpp"

namespace libreyolo::data {

// One object: corners in pixels and the class id (kept as double, like the reference's numpy
// arrays, until the final float32 target rows).
struct Box {
  double x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  double cls = 0;
};

// An image (HWC uint8 RGB, read-only: it may be shared with the RAM cache) and its boxes in
// that image's pixels.
struct Sample {
  torch::Tensor image;
  std::vector<Box> boxes;
};

// A mosaic tile (YoloDataset::load_mosaic_tile): the image at imgsz scale is height x width
// pixels and the boxes are in those pixels. `image` holds that picture at its own resolution (a
// decode not yet resized to height x width, or the resized image itself), which the mosaic
// resamples as it draws. `index`: the dataset image it is (after corrupt images are skipped).
struct Tile {
  torch::Tensor image;
  int height = 0, width = 0;
  std::vector<Box> boxes;
  int64_t index = -1;
};

// Ram: resized images held in memory; Disk: stored beside the images once (data/disk_cache.hpp)
// and read back instead of decoding.
enum class CacheMode { None, Ram, Disk };
// The training option `cache` as a mode: disk; ram, true, 1, yes: Ram; anything else (false, 0,
// no, empty): None.
CacheMode cache_mode(const std::string& option);

struct DatasetOptions {
  int imgsz = 640;
  CacheMode cache = CacheMode::None;
  // Class ids >= num_classes are dropped with a warning (0: no check). The reference does not
  // check, and an out-of-range id would make the loss index out of bounds.
  int num_classes = 0;
  int threads = 0;  // for scanning headers/labels and filling the cache; 0 = hardware threads
  // Decode JPEGs at a reduced DCT scale (1/2, 1/4, 1/8) that still covers the size they are
  // shown at (imgsz; a mosaic tile: its size after the affine's zoom). Faster (a mosaic sample
  // decodes up to four images), but the pixels differ from a full decode + resize, most in fine
  // texture: a tile shown small is decoded small. Boxes are the same. false: the reference's
  // pixels in training and validation alike (bit for bit with cache=ram).
  bool reduced_decode = true;
  // The size images are held at (decoded, cached): Letterbox: the longer side imgsz, the aspect
  // kept; Stretch: imgsz x imgsz, as the family's input fit will take them (models::InputSpec).
  // Boxes follow (Tile, Sample: at that size).
  ops::Fit fit = ops::Fit::Letterbox;
};

// The label file of an image: the last directory components "images" become "labels" (every
// "/images/" in the directory, and a trailing "/images"), the extension becomes ".txt".
std::string label_path_for(const std::string& image_path);

// Parses one YOLO label file into pixel boxes of an image of size (w0, h0). Rows are
// "class cx cy w h" (normalised) or polygons "class x1 y1 ... xn yn" (bbox = min/max). Blank rows
// are ignored; a row with fewer than five fields, that is not numbers, has an odd polygon, a
// negative or fractional class, a class >= num_classes (when > 0), a negative width or height,
// or a box entirely outside the image is skipped and described in *problems as
// "file:line: reason". A box reaching outside [0, 1] is clipped to the image and counted in
// *clipped_rows (when given). A missing file means no objects.
std::vector<Box> parse_label_file(const std::string& label_path, int w0, int h0, int num_classes,
                                  std::vector<std::string>* problems, int64_t* clipped_rows = nullptr);

class YoloDataset {
 public:
  // Probes every image header and reads every label file (in parallel). Images whose header
  // cannot be read are skipped with a warning and counted. No usable image: DataError.
  YoloDataset(const std::vector<std::string>& image_files, DatasetOptions options);
  ~YoloDataset();
  YoloDataset(const YoloDataset&) = delete;
  YoloDataset& operator=(const YoloDataset&) = delete;

  int64_t size() const { return static_cast<int64_t>(records_.size()); }
  int imgsz() const { return options_.imgsz; }
  const std::string& image_path(int64_t i) const { return records_.at(i).path; }
  // Original (height, width) from the image header.
  std::pair<int, int> original_hw(int64_t i) const;
  // Boxes in the original image's pixels.
  std::vector<Box> original_boxes(int64_t i) const;
  // Same as an [N, 5] float tensor (x1, y1, x2, y2, cls), for the evaluator.
  torch::Tensor original_labels(int64_t i) const;
  // The image resized to its size for the dataset's fit (ops::fit_box: the longer side imgsz, sizes
  // truncated; or imgsz x imgsz), bilinear, with the boxes scaled alike. An image that fails to decode is reported once and replaced
  // by the next readable one, so a corrupt file never stops training.
  Sample load_resized(int64_t i) const;
  // The same image and boxes for a mosaic, as cheaply as they come: the cached resized image,
  // or (no cache) the decode, not resized; with reduced_decode, at the DCT scale covering
  // `need` pixels on the longest side (0: imgsz), the resolution at which the mosaic shows it.
  // `slot` (0..3) picks this thread's decode memory: the image is valid until the next call
  // with the same slot on this thread, or as long as it is held when it comes from the cache.
  // Corrupt images are replaced as in load_resized.
  static constexpr int kTileSlots = 4;
  Tile load_mosaic_tile(int64_t i, int slot, int need = 0) const;

  // Pixel-free views for a loader that decodes elsewhere (the GPU loader): the first index from
  // i on (cyclically) not yet found corrupt, and that image's tile geometry (height x width at
  // imgsz scale, boxes in those pixels; no pixels). mark_unreadable records a corrupt image
  // found by such a decoder as load_resized would (warned once, counted, skipped from then on).
  int64_t readable_from(int64_t i) const;
  Tile tile_geometry(int64_t i) const;
  void mark_unreadable(int64_t i, const std::string& why) const;

  // Images skipped at construction plus images found undecodable later.
  int64_t num_corrupt() const { return skipped_ + unreadable_.load(); }
  int64_t num_unreadable() const { return unreadable_.load(); }
  int64_t num_boxes() const { return static_cast<int64_t>(boxes_.size()); }
  // Boxes of image i (from its label file).
  int64_t label_count(int64_t i) const { return static_cast<int64_t>(records_.at(static_cast<size_t>(i)).box_count); }
  // Label rows skipped at construction (malformed, or nothing inside the image) and rows whose
  // box was clipped to the image; both are reported as a warning (first rows listed, then counts).
  int64_t num_label_rows_skipped() const { return labels_skipped_; }
  int64_t num_label_rows_clipped() const { return labels_clipped_; }
  bool cached() const { return !cache_.empty(); }
  bool disk_cached() const { return disk_cache_; }

 private:
  struct Record {
    std::string path;
    int h0 = 0, w0 = 0;
    size_t box_begin = 0, box_count = 0;
  };
  Sample load_record(int64_t i) const;
  Tile load_tile_record(int64_t i, int slot, int need) const;
  // Calls load(j) for j = i, i + 1, ... (cyclically) until an image decodes, marking and
  // reporting the ones that do not.
  template <class Load>
  auto first_readable(int64_t i, Load&& load) const;
  std::vector<Box> boxes_at_imgsz(const Record& r, const ops::FitBox& fit) const;
  // The longest side a reduced decode must keep for an image held at `side` (a stretch needs its
  // shorter side to reach it, so that nothing is upsampled from the decode).
  int decode_target(const Record& r, int side) const;
  // The record's image decoded and resized to its imgsz size (ops::fit_box of the header's).
  torch::Tensor decode_resized(const Record& r) const;
  void fill_cache();
  void fill_disk_cache();
  // Drops the records whose `problems` entry is set (undecodable images), reporting them; returns
  // the indices (before dropping) of the records kept, in order.
  std::vector<size_t> drop_unreadable(const std::vector<std::string>& problems);

  DatasetOptions options_;
  std::vector<Record> records_;
  std::vector<Box> boxes_;
  std::vector<torch::Tensor> cache_;
  bool disk_cache_ = false;  // cache=disk is in use (it can be turned off for lack of space)
  std::unique_ptr<std::atomic<bool>[]> bad_;
  int64_t skipped_ = 0;
  int64_t labels_skipped_ = 0, labels_clipped_ = 0;
  mutable std::atomic<int64_t> unreadable_{0};
};

// Boxes as an [N, 5] float tensor (x1, y1, x2, y2, cls).
torch::Tensor boxes_to_tensor(const std::vector<Box>& boxes);

}  // namespace libreyolo::data
