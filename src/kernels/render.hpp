// Draws training/validation samples from decoded images on the GPU: the GPU loader's pixels
// (data/gpu_batch.hpp). One thread per output pixel; each sample is a plan of up to four tiles
// on a canvas (data/augment.hpp SampleDraw): every tile is its source image resized to
// tile_w x tile_h with resize_bilinear's fixed-point arithmetic, placed on the canvas; an output
// pixel is its canvas pixel, or (warp) the canvas sampled bilinearly through the affine map;
// then the flip and the HSV shift of data/hsv.cpp, in the same integer, single- and
// double-precision arithmetic (no contractions into fused multiply-adds), so that the result
// equals data::render_sample bit for bit. Plain pointers and a cudaStream_t only.
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
  int canvas_w = 0, canvas_h = 0;
  int warp = 0;
  // Canvas point of output pixel (x, y): (r00 dx + r01 dy, r10 dx + r11 dy), dx = x - tx, dy = y - ty.
  double r00 = 1, r01 = 0, r10 = 0, r11 = 1, tx = 0, ty = 0;
  int content_w = 0, content_h = 0;
  int hsv = 0, flip = 0;
  int gain_h = 0, gain_s = 0, gain_v = 0;  // gain_h already reduced to [0, 180)
};

// samples: `count` descriptors in device memory; out: [count, S, S, 3] uint8 on the device.
void render_samples(const RenderSample* samples, int count, int S, uint8_t* out, cudaStream_t stream);

}  // namespace libreyolo::kernels
