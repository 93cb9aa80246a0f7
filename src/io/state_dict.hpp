// The state dict: parameter and buffer names with their tensors, as in a checkpoint's `model`
// entry. A header of its own so that models can name it without the pickle reader's API.
#pragma once
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::io {

// Parameter/buffer name -> tensor, in the file's (or the module's registration) order.
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// `key` without DDP's "module." prefixes.
std::string strip_ddp_prefix(std::string key);
// The tensor named `key`: an exact match first, else the first entry whose name `canonical` maps
// to `key` (a family's legacy renames). nullptr when none.
const torch::Tensor* find_tensor(const StateDict& sd, const std::string& key,
                                 const std::function<std::string(const std::string&)>& canonical);
// Leading dimension of that tensor, if it exists and is at least 1-d (a layer's output channels).
std::optional<int64_t> leading_dim(const StateDict& sd, const std::string& key,
                                   const std::function<std::string(const std::string&)>& canonical);

}  // namespace libreyolo::io
