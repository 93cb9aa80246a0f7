// The state dict: parameter and buffer names with their tensors, as in a checkpoint's `model`
// entry. A header of its own so that models can name it without the pickle reader's API.
#pragma once
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace libreyolo::io {

// Parameter/buffer name -> tensor, in the file's (or the module's registration) order.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

}  // namespace libreyolo::io
