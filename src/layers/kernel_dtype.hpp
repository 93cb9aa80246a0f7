// The element type of this project's CUDA kernels (kernels/*.hpp) for a torch dtype: float32,
// float16 and bfloat16 have one; false for any other.
#pragma once
#include <c10/core/ScalarType.h>

#include "kernels/bn_act.hpp"  // DType

namespace libreyolo::models {

inline bool kernel_dtype(c10::ScalarType t, kernels::DType* out) {
  switch (t) {
    case c10::kFloat: *out = kernels::DType::Float32; return true;
    case c10::kHalf: *out = kernels::DType::Float16; return true;
    case c10::kBFloat16: *out = kernels::DType::BFloat16; return true;
    default: return false;
  }
}

}  // namespace libreyolo::models
