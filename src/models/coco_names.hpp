#pragma once
#include <string>
#include <vector>

namespace libreyolo::models {
// The 80 COCO class names, the default names of a model with 80 classes.
const std::vector<std::string>& coco_names();
// Names for nc classes when a checkpoint carries none: COCO's for 80, else "class0", ...
std::vector<std::string> default_names(int nc);
}  // namespace libreyolo::models
