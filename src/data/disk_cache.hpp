// cache=disk: each training image decoded and resized once (to its size for the dataset's fit:
// longer side = imgsz for a letterbox, imgsz x imgsz for a stretch), stored next to the image as
// <image dir>/.libreyolo_cache/<file name>.<imgsz>.rgb (<imgsz>.stretch.rgb; ".full" before
// ".rgb" for a dataset that decodes JPEGs in full, whose pixels differ from the reduced decode's),
// and read back on later epochs and later runs instead of decoding the JPEG again.
//
// An entry records the source file's size and modification time; a source that changed (or an
// entry that is truncated, foreign or corrupt: the file is untrusted like the dataset) is not
// used: the image is decoded again and the entry rewritten. Writes go to a temporary file and are
// renamed into place, so a reader never sees half an entry.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>

#include "ops/image_ops.hpp"

namespace libreyolo::data {

// reduced_decode: the dataset's decode (DatasetOptions); entries of the two decodes are kept apart.
std::string disk_cache_path(const std::string& image_path, int imgsz, ops::Fit fit = ops::Fit::Letterbox,
                            bool reduced_decode = true);
// The cached image (HWC uint8) when the entry is valid for the source as it is now.
std::optional<torch::Tensor> read_disk_cache(const std::string& image_path, int imgsz,
                                             ops::Fit fit = ops::Fit::Letterbox, bool reduced_decode = true);
// Stores `hwc` for the source as it is now. False (no exception) when it cannot be written.
bool write_disk_cache(const std::string& image_path, int imgsz, const torch::Tensor& hwc,
                      ops::Fit fit = ops::Fit::Letterbox, bool reduced_decode = true);
// Bytes an entry of an h x w image takes.
int64_t disk_cache_entry_bytes(int h, int w);

}  // namespace libreyolo::data
