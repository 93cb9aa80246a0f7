// PIL's bicubic resampling of uint8 HWC images on the device, with ops/resample.cpp's arithmetic
// (fixed-point taps made on the host, a horizontal pass into uint8, then a vertical pass), so that
// the bytes equal the host's. Plain pointers only; ops/resample.cpp is the torch side.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace libreyolo::kernels {

// One axis's taps on the device: per output position its first source index and tap count, and
// `ksize` fixed-point weights.
struct ResampleTaps {
  const int64_t* first = nullptr;
  const int64_t* count = nullptr;
  const int32_t* weights = nullptr;
  int64_t ksize = 0;
};

// mid[r, x, ch] for source rows row0 + r (r < rows) and output columns left + x (x < win_w):
// src is [*, src_w, channels].
void resample_horizontal(const uint8_t* src, int64_t src_w, int64_t channels, int64_t row0, int64_t rows,
                         const ResampleTaps& tx, int64_t left, int64_t win_w, uint8_t* mid, cudaStream_t stream);
// out[y, i] for output rows top + y (y < win_h) over the mid rows starting at source row row0:
// mid is [*, stride] with stride = win_w * channels.
void resample_vertical(const uint8_t* mid, int64_t stride, int64_t row0, const ResampleTaps& ty, int64_t top,
                       int64_t win_h, uint8_t* out, cudaStream_t stream);

}  // namespace libreyolo::kernels
