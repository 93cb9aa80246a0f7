// Image files <-> uint8 tensors. Images are HWC, RGB, uint8, contiguous, on the CPU.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace libreyolo::io {

struct ImageSize {
  int height = 0;
  int width = 0;
};

// Decodes JPEG or PNG (and uncompressed BMP) by content, not extension, to [H, W, 3] uint8 RGB.
// Grey and CMYK JPEGs, and grey, palette, 16-bit (high byte kept) and alpha PNGs are converted
// to RGB (alpha is dropped). EXIF orientation is not applied (as LibreYOLO's PIL-based predict).
// Corrupt or unsupported data, a truncated file, or a header claiming more than 2^28 pixels:
// DataError naming `name`. (libjpeg would return a truncated JPEG with its missing rows grey;
// we refuse it so that a damaged file never trains silently. Harmless JPEG warnings such as
// extraneous bytes before a marker are ignored.)
torch::Tensor decode_image(const std::string& path);
torch::Tensor decode_image_bytes(const uint8_t* data, size_t size, const std::string& name);
// As decode_image, but a JPEG is decoded at the smallest of the scales 1/8, 1/4, 1/2 (libjpeg
// DCT scaling) whose longest side is still >= target_longest_side, else at full size: cheaper
// when the image is resized down afterwards anyway (the other n/8 scales decode slower than the
// full image with libjpeg-turbo, so they are not used). Other formats decode at full size.
torch::Tensor decode_image_for_size(const std::string& path, int target_longest_side);

// Memory reused across decodes on one thread (the file's bytes and the pixels), so that a
// loader does not allocate, and fault in, megabytes per image. Not thread-safe: one per thread.
class DecodeScratch {
 public:
  uint8_t* pixels(size_t bytes);  // at least `bytes`, contents unspecified
  std::vector<uint8_t>& file() { return file_; }

 private:
  std::unique_ptr<uint8_t[]> pixels_;  // not value-initialised when it grows
  size_t capacity_ = 0;
  std::vector<uint8_t> file_;
};
// As decode_image_for_size (target_longest_side 0: as decode_image), but the file is read into
// and the pixels are decoded into `scratch`: the result is a view of its memory, valid until
// `scratch` is used again (copy or resize it before then).
torch::Tensor decode_image_for_size(const std::string& path, int target_longest_side, DecodeScratch& scratch);
// Reads only the header.
ImageSize probe_image_size(const std::string& path);
// Encodes [H, W, 3] uint8 RGB (or [H, W, 1] grey); the format follows the extension
// (.jpg/.jpeg or .png).
void save_image(const std::string& path, const torch::Tensor& hwc_rgb, int jpeg_quality = 95);
std::string encode_jpeg(const torch::Tensor& hwc_rgb, int quality = 95);
std::string encode_png(const torch::Tensor& hwc_rgb);
// True for the extensions of the formats this build decodes (jpg jpeg png bmp, any case): what a
// dataset scan or a predict folder takes.
bool has_image_extension(const std::string& path);
// True for other image formats' extensions (gif tif tiff webp ...): skipped by the scans, with a
// warning that counts them, instead of listed and then reported corrupt.
bool has_unread_image_extension(const std::string& path);

}  // namespace libreyolo::io
