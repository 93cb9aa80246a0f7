#include "models/coco_names.hpp"

namespace libreyolo::models {

const std::vector<std::string>& coco_names() {
  static const std::vector<std::string> names = {
      "person",        "bicycle",      "car",           "motorcycle",    "airplane",     "bus",
      "train",         "truck",        "boat",          "traffic light", "fire hydrant", "stop sign",
      "parking meter", "bench",        "bird",          "cat",           "dog",          "horse",
      "sheep",         "cow",          "elephant",      "bear",          "zebra",        "giraffe",
      "backpack",      "umbrella",     "handbag",       "tie",           "suitcase",     "frisbee",
      "skis",          "snowboard",    "sports ball",   "kite",          "baseball bat", "baseball glove",
      "skateboard",    "surfboard",    "tennis racket", "bottle",        "wine glass",   "cup",
      "fork",          "knife",        "spoon",         "bowl",          "banana",       "apple",
      "sandwich",      "orange",       "broccoli",      "carrot",        "hot dog",      "pizza",
      "donut",         "cake",         "chair",         "couch",         "potted plant", "bed",
      "dining table",  "toilet",       "tv",            "laptop",        "mouse",        "remote",
      "keyboard",      "cell phone",   "microwave",     "oven",          "toaster",      "sink",
      "refrigerator",  "book",         "clock",         "vase",          "scissors",     "teddy bear",
      "hair drier",    "toothbrush"};
  return names;
}

std::vector<std::string> default_names(int nc) {
  if (nc == 80) return coco_names();
  std::vector<std::string> out;
  for (int i = 0; i < nc; ++i) out.push_back("class" + std::to_string(i));
  return out;
}

}  // namespace libreyolo::models
