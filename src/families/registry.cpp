// The registry: every family this build has, in the order model names and weights are matched.
// A new family adds its folder and one line here.
#include "models/detector.hpp"
#include "families/yolo9/model.hpp"
#include "families/rtdetr/model.hpp"
#include "families/yolox/model.hpp"
#include "families/yolo7/model.hpp"
#include "families/rtmdet/model.hpp"
#include "families/picodet/model.hpp"
#include "families/resnet/model.hpp"
#include "families/mobilenetv4/model.hpp"
#include "families/efficientnetv2/model.hpp"

namespace libreyolo::models {

const std::vector<const Family*>& families() {
  static const std::vector<Family> entries = {
      yolo9::make_family(),
      yolox::make_family(),
      rtdetr::make_dfine_family(),
      rtdetr::make_deim_family(),
      rtdetr::make_rtdetrv4_family(),
      rtdetr::make_family(),
      rtdetr::make_v2_family(),
      yolo7::make_family(),
      rtmdet::make_family(),
      picodet::make_family(),
      resnet::make_family(),
      mobilenetv4::make_family(),
      efficientnetv2::make_family(),
  };
  static const std::vector<const Family*> all = [] {
    std::vector<const Family*> v;
    for (const Family& f : entries) v.push_back(&f);
    return v;
  }();
  return all;
}

const Family* find_family(const std::string& name) {
  for (const Family* f : families()) {
    if (f->name == name) return f;
  }
  return nullptr;
}

std::string default_model_name() {
  const Family* f = families().front();
  return f->name + f->default_size;
}

const Family* detect_family(const io::StateDict& sd) {
  for (const Family* f : families()) {
    if (f->can_load && f->can_load(sd)) return f;
  }
  return nullptr;
}

}  // namespace libreyolo::models
