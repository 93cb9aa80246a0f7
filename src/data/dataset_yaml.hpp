// LibreYOLO's dataset YAML (path / train / val / test / names / nc) and image-list resolution.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace libreyolo::data {

struct DatasetSpec {
  std::string yaml_path;  // absolute path of the YAML file
  std::string root;       // resolved dataset root
  // Split name ("train", "val", "test") -> its sources as absolute paths, in YAML order. A source
  // is a directory (scanned recursively), a .txt list of images, or an image file.
  std::map<std::string, std::vector<std::string>> splits;
  std::vector<std::string> names;  // class names, index = class id
  int nc = 0;

  bool has_split(const std::string& split) const { return splits.count(split) > 0; }
};

// The most classes a dataset YAML may declare (nc, or the number of names / the largest names
// id + 1). Far above any real detection dataset (COCO 80, Objects365 365, LVIS 1203, Open Images
// 601); a larger value is a typo that would otherwise only surface as an out-of-memory error
// when the detection head is built.
constexpr int kMaxClasses = 100000;

// Reads and resolves a dataset YAML. Missing file: DataError (data_not_found). Unreadable YAML,
// neither names nor nc, nc not a positive integer or above kMaxClasses, more than kMaxClasses
// names: DataError (data_invalid) naming the key. Splits are resolved to paths but not scanned.
DatasetSpec load_dataset_yaml(const std::string& yaml_path);

// The images of one split, in order: each directory's files sorted, lists in their own order.
// Split absent from the YAML or a source that does not exist: DataError (data_not_found);
// no image found: DataError (data_invalid).
std::vector<std::string> list_split_images(const DatasetSpec& spec, const std::string& split);

// Same resolution for explicit sources (directories, .txt lists, image files).
std::vector<std::string> list_images(const std::vector<std::string>& sources,
                                     const std::string& what);

// The directory relative dataset roots are tried under first: $LIBREYOLO_DATASETS_DIR, else
// ~/datasets.
std::string datasets_dir();

}  // namespace libreyolo::data
