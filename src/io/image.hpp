// Image files <-> uint8 tensors. Images are HWC, RGB, uint8, contiguous, on the CPU.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace libreyolo::io {

struct ImageSize {
  int height = 0;
  int width = 0;
};

// Decodes JPEG or PNG (by content, not extension) to [H, W, 3] uint8 RGB. Grey and
// palette/alpha PNGs are converted to RGB. Corrupt or unsupported data: DataError naming `name`.
torch::Tensor decode_image(const std::string& path);
torch::Tensor decode_image_bytes(const uint8_t* data, size_t size, const std::string& name);
// Reads only the header.
ImageSize probe_image_size(const std::string& path);
// Encodes [H, W, 3] uint8 RGB; the format follows the extension (.jpg/.jpeg or .png).
void save_image(const std::string& path, const torch::Tensor& hwc_rgb, int jpeg_quality = 95);
std::string encode_jpeg(const torch::Tensor& hwc_rgb, int quality = 95);
std::string encode_png(const torch::Tensor& hwc_rgb);
// True for the extensions a dataset directory scan accepts (jpg jpeg png bmp ... any case).
bool has_image_extension(const std::string& path);

}  // namespace libreyolo::io
