#include "data/classify.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "io/image.hpp"
#include "ops/resample.hpp"

namespace fs = std::filesystem;

namespace libreyolo::data {

namespace {

std::vector<std::string> sorted_subdirs(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind('.', 0) != 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> images_in(const fs::path& dir, bool recursive) {
  std::vector<std::string> out;
  std::error_code ec;
  if (recursive) {
    for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
         it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec) && io::has_image_extension(it->path().string())) out.push_back(it->path().string());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file(ec) && io::has_image_extension(e.path().string())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_yaml(const fs::path& p) {
  const auto ext = p.extension().string();
  return ext == ".yaml" || ext == ".yml";
}

[[noreturn]] void detection_layout(const std::string& data) {
  throw DataError("'" + data + "' is a detection dataset (a YAML file or images/ and labels/ folders), but the model is "
                  "a classifier",
                  "Give a classifier a folder of class folders: <root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg; "
                  "give a detection dataset to a detection model.",
                  "data_task_mismatch");
}

[[noreturn]] void no_class_folders(const std::string& dir, bool loose_images) {
  throw DataError("'" + dir + "' has " + (loose_images ? "images but no class folders" : "no class folders") +
                      ": a classification dataset is one folder per class",
                  "Arrange the images as <root>/train/<class_name>/<image>.jpg and <root>/val/<class_name>/<image>.jpg.",
                  "data_no_class_folders");
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

ClassifySplit load_classify_split(const std::string& dir, std::vector<std::string>& names) {
  const fs::path d(dir);
  const auto classes = sorted_subdirs(d);
  ClassifySplit split;
  split.dir = dir;
  if (classes.empty()) no_class_folders(dir, !images_in(d, false).empty());
  if (names.empty()) {
    names = classes;
  } else if (classes != names) {
    std::vector<std::string> unknown, missing;
    const std::set<std::string> want(names.begin(), names.end()), have(classes.begin(), classes.end());
    for (const auto& c : classes)
      if (!want.count(c)) unknown.push_back(c);
    for (const auto& c : names)
      if (!have.count(c)) missing.push_back(c);
    throw DataError("'" + dir + "' does not have the training split's classes" +
                        (unknown.empty() ? "" : "; unknown: " + join(unknown)) +
                        (missing.empty() ? "" : "; missing: " + join(missing)),
                    "Every split needs exactly the class folders of train/.", "data_class_mismatch");
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const auto files = images_in(d / names[i], true);
    for (const auto& f : files) split.samples.push_back({f, static_cast<int64_t>(i)});
  }
  if (split.samples.empty())
    throw DataError("'" + dir + "' has class folders but no images (.jpg, .jpeg, .png, .bmp) in them", "",
                    "data_no_images");
  return split;
}

ClassifyDataset load_classify_dataset(const std::string& data) {
  std::error_code ec;
  fs::path p(data);
  if (data.empty()) throw UsageError("data= is required: a folder of class folders (<root>/train/<class>/...)");
  if (data == "builtin") detection_layout(data);  // the generated shapes dataset is a detection one
  if (!fs::exists(p, ec)) throw DataError("Dataset not found: " + data, "", "data_not_found");
  if (fs::is_regular_file(p, ec)) {
    if (is_yaml(p)) detection_layout(data);
    throw DataError("'" + data + "' is a file; a classification dataset is a folder of class folders", "",
                    "data_invalid");
  }
  if (fs::is_directory(p / "images", ec) && fs::is_directory(p / "labels", ec)) detection_layout(data);
  const std::string leaf = p.filename().string().empty() ? p.parent_path().filename().string() : p.filename().string();
  if (!fs::is_directory(p / "train", ec) && (leaf == "train" || leaf == "val" || leaf == "test")) p = p.parent_path();
  if (fs::is_directory(p / "images", ec) && fs::is_directory(p / "labels", ec)) detection_layout(data);
  ClassifyDataset ds;
  ds.root = p.string();
  if (!fs::is_directory(p / "train", ec)) {
    const bool loose = !images_in(p, false).empty();
    if (loose || sorted_subdirs(p).empty()) no_class_folders(p.string(), loose);
    throw DataError("'" + data + "' has no train/ folder",
                    "Arrange it as " + data + "/train/<class>/*.jpg and " + data + "/val/<class>/*.jpg.",
                    "data_no_train_split");
  }
  ds.train = load_classify_split((p / "train").string(), ds.names);
  if (fs::is_directory(p / "val", ec)) {
    ds.val = load_classify_split((p / "val").string(), ds.names);
    ds.has_val = true;
  } else {
    log_warn("'" + ds.root + "' has no val/ split: validating on the training split");
    ds.val = ds.train;
  }
  return ds;
}

torch::Tensor classify_eval_transform(const torch::Tensor& hwc, int size, double crop_pct) {
  if (!(crop_pct > 0.0 && crop_pct <= 1.0)) throw UsageError("crop_pct must be in (0, 1]");
  const int64_t h = hwc.size(0), w = hwc.size(1);
  const auto resize = static_cast<int64_t>(std::floor(size / crop_pct));
  // torchvision's Resize(int): the shorter side to `resize`, the longer int(resize * long / short).
  int64_t nh, nw;
  if (w <= h) {
    nw = resize;
    nh = static_cast<int64_t>(static_cast<double>(resize) * static_cast<double>(h) / static_cast<double>(w));
  } else {
    nh = resize;
    nw = static_cast<int64_t>(static_cast<double>(resize) * static_cast<double>(w) / static_cast<double>(h));
  }
  // CenterCrop: the offsets round((n - S) / 2), after zero padding when the image is smaller.
  if (nh >= size && nw >= size) {  // only the crop's pixels of the resize are computed
    const auto top = static_cast<int64_t>(std::nearbyint((nh - size) / 2.0));
    const auto left = static_cast<int64_t>(std::nearbyint((nw - size) / 2.0));
    return ops::resize_bicubic_pil_window(hwc, nh, nw, top, left, size, size);
  }
  auto img = (nh == h && nw == w) ? hwc : ops::resize_bicubic_pil(hwc, nh, nw);
  {
    const int64_t ph = std::max<int64_t>(size - nh, 0), pw = std::max<int64_t>(size - nw, 0);
    auto padded = torch::zeros({nh + ph, nw + pw, 3}, hwc.options());
    padded.narrow(0, ph / 2, nh).narrow(1, pw / 2, nw).copy_(img);
    img = padded;
    nh += ph, nw += pw;
  }
  const auto top = static_cast<int64_t>(std::nearbyint((nh - size) / 2.0));
  const auto left = static_cast<int64_t>(std::nearbyint((nw - size) / 2.0));
  return img.narrow(0, top, size).narrow(1, left, size).contiguous();
}

torch::Tensor classify_train_transform(const torch::Tensor& hwc, int size, double flip_prob, Rng& rng,
                                       double scale_min, double scale_max) {
  const int64_t h = hwc.size(0), w = hwc.size(1);
  const double area = static_cast<double>(h * w);
  const double log_r0 = std::log(3.0 / 4.0), log_r1 = std::log(4.0 / 3.0);
  int64_t ch = 0, cw = 0, top = 0, left = 0;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target = area * rng.uniform(scale_min, scale_max);
    const double ratio = std::exp(rng.uniform(log_r0, log_r1));
    const auto cw_try = static_cast<int64_t>(std::nearbyint(std::sqrt(target * ratio)));
    const auto ch_try = static_cast<int64_t>(std::nearbyint(std::sqrt(target / ratio)));
    if (cw_try > 0 && cw_try <= w && ch_try > 0 && ch_try <= h) {
      cw = cw_try, ch = ch_try;
      top = rng.randint(0, h - ch);
      left = rng.randint(0, w - cw);
      found = true;
    }
  }
  if (!found) {  // the whole image at the nearest allowed ratio, centred
    const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
    if (in_ratio < 3.0 / 4.0) {
      cw = w, ch = static_cast<int64_t>(std::nearbyint(w / (3.0 / 4.0)));
    } else if (in_ratio > 4.0 / 3.0) {
      ch = h, cw = static_cast<int64_t>(std::nearbyint(h * (4.0 / 3.0)));
    } else {
      cw = w, ch = h;
    }
    top = (h - ch) / 2, left = (w - cw) / 2;
  }
  auto crop = hwc.narrow(0, top, ch).narrow(1, left, cw).contiguous();
  auto out = ops::resize_bicubic_pil(crop, size, size);
  if (flip_prob > 0 && rng.uniform() < flip_prob) out = out.flip(1).contiguous();
  return out;
}

}  // namespace libreyolo::data
