// Detection post-processing on the GPU with no host synchronisation: from predictions
// [B, 4 + nc, A] (rows 0-3 xyxy boxes in network-input pixels, rows 4.. class scores) to each
// image's detections after class-aware greedy NMS, in fixed-size output rows that the caller
// copies to the host once. The same results, bit for bit, as ops::postprocess_yolo's host path
// (ops/postprocess.hpp): every (anchor, class) with score > conf is a candidate; candidates ordered
// by descending score, equal scores by (class, anchor); x and y divided by the image's fit scales
// and clipped; rows with width or height <= 0 or a non-finite score dropped; a box is
// suppressed by an earlier kept box of its class with IoU > iou (float32, rounded as the host
// computes it); the first max_det kept boxes returned.
//
// Two launches: the candidates' sort keys gathered into a buffer of kDetectNmsCapacity per image
// (an atomic counter per image), then one block per image sorts them and runs the greedy pass.
// An image with more candidates than the buffer holds is reported (its count) and left to the
// caller, which takes its exact host path: the capacity is below the host path's 30,000-candidate
// cap, so within it no candidate is ever dropped for lack of room.
//
// Plain pointers and a cudaStream_t only; ops/postprocess.cpp is the torch side.
#pragma once
#include <cstdint>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::kernels {

constexpr int kDetectNmsCapacity = 4096;  // candidates per image sorted in shared memory
constexpr int kDetectNmsMaxImages = 64;   // images per launch of the second kernel (geometry by value)

struct DetectImage {
  float sx = 1.f, sy = 1.f;  // input pixels per original pixel (x and y coordinates are divided by them)
  float width = 0.f, height = 0.f;  // the original image, the clipping bounds
};

struct DetectNmsLaunch {
  int64_t batch = 0;
  int64_t anchors = 0;  // A
  int classes = 0;      // nc
  DType dtype = DType::Float32;  // of pred
  float conf = 0.f;  // candidates have score > conf, compared in float32 (already rounded to dtype)
  float iou = 0.f;   // suppression when IoU > iou (already rounded down to float32)
  int max_det = 0;   // kept rows per image, at most kDetectNmsCapacity
  cudaStream_t stream = nullptr;
};

// Bytes of scratch detect_nms needs (device memory, no initialisation required).
int64_t detect_nms_workspace_bytes(int64_t batch);

// pred: [batch, 4 + classes, anchors] packed. images: `batch` geometries (host memory, passed to
// the kernels by value). out: [batch, 2 + 6 * max_det] float32: per image [candidates found,
// rows kept, then rows of x1, y1, x2, y2, score, class]. When candidates found exceeds
// kDetectNmsCapacity, rows kept is 0 and the rows are not written.
void detect_nms(const DetectNmsLaunch& l, const void* pred, const DetectImage* images, void* workspace,
                float* out);

}  // namespace libreyolo::kernels
