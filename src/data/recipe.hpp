// The part of a training augmentation recipe that a family chooses (Family::augment). Every
// recipe shares the mosaic: four tiles on a 2S x 2S canvas, taken to S x S by a random affine so
// that the output is a window of the canvas at about the tiles' own scale.
#pragma once

namespace libreyolo::data {

enum class Mixup {
  // The mosaic averaged with a partner image through the plain path (letterbox, HSV, flip) with a
  // Beta(32, 32) weight, both label sets kept.
  Blend,
  // A partner image letterboxed, scaled by U(mixup_scale), maybe mirrored, cropped at a random
  // offset and averaged 0.5 / 0.5 with the mosaic (truncated), its labels appended; HSV and flip
  // come after it. Not planned for the GPU loader.
  ScaledPaste,
};

struct AugmentRecipe {
  Mixup mixup = Mixup::Blend;
  // Mosaic boxes with a side of at most this many pixels are dropped (0: none).
  double drop_box_side = 2.0;
  // HSV and flip also on images without boxes (else such an image is only fitted).
  bool augment_empty = true;
  // Boxes a sample keeps (its target rows, padded to this many).
  int max_labels = 100;
};

}  // namespace libreyolo::data
