// The YOLOv7 parity fixture (tests/data/yolo7_reference.pt, made by
// tests/python/make_yolo7_fixture.py from LibreYOLO 1.6.0 at 1/16 of b's widths, 3 classes): the
// checkpoint, read once per test program, and its recorded tensors by name.
#pragma once
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "io/pickle.hpp"

namespace libreyolo::test {

inline const std::string& yolo7_fixture_path() {
  static const std::string path = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/yolo7_reference.pt";
  return path;
}

inline io::PyValuePtr yolo7_fixture() {
  static io::PyValuePtr root = io::load_torch_file(yolo7_fixture_path());
  return root;
}

// The recorded tensor `key` of the fixture's "expect" dict (throws when absent).
inline torch::Tensor yolo7_expected(const std::string& key) {
  auto v = yolo7_fixture()->get("expect")->get(key);
  if (!v || !v->is_tensor()) throw std::runtime_error("the YOLOv7 fixture has no tensor " + key);
  return v->tensor;
}

}  // namespace libreyolo::test
