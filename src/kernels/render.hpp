// Draws training/validation samples from decoded images on the GPU: the GPU loader's pixels
// (data/gpu_batch.hpp). One thread per output pixel; each sample is a plan of up to four tiles
// (data/augment.hpp SampleDraw): every tile is its source image resized to tile_w x tile_h with
// resize_bilinear's fixed-point arithmetic, placed on a canvas `factor` times the output size,
// and each output pixel is the rounded mean of its factor x factor canvas pixels; then the flip
// and the HSV shift of data/augment.cpp, in the same integer and single-precision arithmetic, so
// that the result equals data::render_sample bit for bit. Plain pointers and a cudaStream_t only.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace libreyolo::kernels {

struct RenderTile {
  const uint8_t* src = nullptr;  // device, [src_h, src_w, 3] uint8, rows of src_w * 3 bytes
  int src_w = 0, src_h = 0;
  int tile_w = 0, tile_h = 0;
  int offset_x = 0, offset_y = 0;
  int x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

struct RenderSample {
  RenderTile tiles[4];
  int num_tiles = 0;
  int factor = 1;
  int content_w = 0, content_h = 0;
  int hsv = 0, flip = 0;
  int gain_h = 0, gain_s = 0, gain_v = 0;  // gain_h already reduced to [0, 180)
};

// samples: `count` descriptors in device memory; out: [count, S, S, 3] uint8 on the device.
void render_samples(const RenderSample* samples, int count, int S, uint8_t* out, cudaStream_t stream);

}  // namespace libreyolo::kernels
