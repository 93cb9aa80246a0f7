// The classify task's recipe, shared by the classifier families (ResNet, MobileNetV4,
// EfficientNetV2).
#pragma once
#include "models/detector.hpp"

namespace libreyolo::models {

// LibreYOLO's classification recipe: task "classify", 1000 classes for a fresh model, the
// cross-entropy loss (loss/classify.hpp), RGB / 255 with ImageNet's mean and deviation, AdamW at
// 1e-3 (decay 1e-4 on convolution and linear weights), a quadratic warm-up of one epoch from 0 then
// a cosine to 1 % of lr0, EMA 0.9998, AMP on, validation every epoch, no detection augmentation.
void apply_classify_recipe(Family& f);

}  // namespace libreyolo::models
