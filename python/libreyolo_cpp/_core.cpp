// The Python module over the public C++ API (include/libreyolo): the package's `_core`. Options
// cross as strings (the same key=value grammar as the command line, so unknown keys, ranges and
// their messages are the C++ ones); results come back as plain Python objects. The GIL is released
// while the C++ side trains, validates or predicts, and taken again for each Python callback.
// Exceptions keep their class (usage, data, model, runtime, interrupted), machine-readable code,
// suggestion and exit code.
#include <map>

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

namespace py = pybind11;
using libreyolo::Kwargs;

namespace {

// An image's detections as three arrays (boxes [N, 4] float32, scores [N] float32, classes [N]
// int64) and the class names as one list: a few Python objects per image, not five per box (a
// dict per detection made predict of an untrained model's 300 boxes about 1 ms slower than the
// C++ call).
py::dict predict_dict(const libreyolo::PredictResult& r) {
  py::dict o;
  o["source"] = r.source;
  o["height"] = r.height;
  o["width"] = r.width;
  const auto n = static_cast<py::ssize_t>(r.detections.size());
  py::array_t<float> boxes({n, py::ssize_t{4}});
  py::array_t<float> scores(n);
  py::array_t<int64_t> classes(n);
  auto b = boxes.mutable_unchecked<2>();
  auto s = scores.mutable_unchecked<1>();
  auto c = classes.mutable_unchecked<1>();
  py::list names;
  std::map<int, py::str> name_of;  // one str object per class, shared by its boxes
  for (py::ssize_t i = 0; i < n; ++i) {
    const auto& d = r.detections[static_cast<size_t>(i)];
    b(i, 0) = d.x1;
    b(i, 1) = d.y1;
    b(i, 2) = d.x2;
    b(i, 3) = d.y2;
    s(i) = d.score;
    c(i) = d.class_id;
    auto it = name_of.find(d.class_id);
    if (it == name_of.end()) it = name_of.emplace(d.class_id, py::str(d.class_name)).first;
    names.append(it->second);
  }
  o["boxes"] = boxes;
  o["scores"] = scores;
  o["classes"] = classes;
  o["names"] = names;
  py::list top;
  for (const auto& c : r.top) {
    py::dict t;
    t["class_id"] = c.class_id;
    t["class_name"] = c.class_name;
    t["score"] = c.score;
    top.append(t);
  }
  o["top"] = top;
  o["probs"] = r.probs;
  o["saved_path"] = r.saved_path;
  o["speed"] = py::dict(py::arg("preprocess_ms") = r.preprocess_ms, py::arg("inference_ms") = r.inference_ms,
                        py::arg("postprocess_ms") = r.postprocess_ms);
  return o;
}

py::dict pairs_dict(const std::vector<std::pair<std::string, double>>& kv) {
  py::dict o;
  for (const auto& [k, v] : kv) o[py::str(k)] = v;
  return o;
}

py::dict epoch_dict(const libreyolo::EpochSummary& e) {
  py::dict o;
  o["epoch"] = e.epoch;
  o["seconds"] = e.seconds;
  o["loss"] = e.loss;
  o["losses"] = pairs_dict(e.losses);
  o["lrs"] = e.lrs;
  o["validated"] = e.validated;
  o["is_best"] = e.is_best;
  o["mAP50"] = e.map50;
  o["mAP50_95"] = e.map50_95;
  o["metrics"] = pairs_dict(e.metrics);
  return o;
}

py::dict train_dict(const libreyolo::TrainResult& r) {
  py::dict o;
  o["final_loss"] = r.final_loss;
  py::list epochs;
  for (const auto& e : r.epochs) epochs.append(epoch_dict(e));
  o["epochs"] = epochs;
  o["best_mAP50"] = r.best_mAP50;
  o["best_mAP50_95"] = r.best_mAP50_95;
  o["best_epoch"] = r.best_epoch;
  o["save_dir"] = r.save_dir;
  o["best_checkpoint"] = r.best_checkpoint;
  o["last_checkpoint"] = r.last_checkpoint;
  o["total_seconds"] = r.total_seconds;
  return o;
}

py::dict val_dict(const libreyolo::ValResult& r) {
  py::dict o;
  o["metrics"] = pairs_dict(r.metrics);
  py::list classes;
  for (const auto& c : r.classes) {
    py::dict d;
    d["id"] = c.id;
    d["name"] = c.name;
    d["images"] = c.images;
    d["instances"] = c.instances;
    d["precision"] = c.precision;
    d["recall"] = c.recall;
    d["mAP50"] = c.mAP50;
    d["mAP50_95"] = c.mAP50_95;
    classes.append(d);
  }
  o["classes"] = classes;
  o["table"] = r.table;
  o["save_dir"] = r.save_dir;
  return o;
}

py::dict info_dict(const libreyolo::ModelInfo& i) {
  py::dict o;
  o["family"] = i.family;
  o["size"] = i.size;
  o["task"] = i.task;
  o["num_classes"] = i.num_classes;
  o["names"] = i.names;
  o["imgsz"] = i.imgsz;
  o["parameters"] = i.parameters;
  o["device"] = i.device;
  o["weights"] = i.weights;
  o["amp_default"] = i.amp_default;
  o["amp_default_reason"] = i.amp_default_reason;
  return o;
}

// The Python exception classes (created in the package's __init__ is too late for the
// translator: they live here and the package re-exports them).
struct Exceptions {
  py::object base, usage, data, model, runtime, interrupted;
};
Exceptions& exceptions() {
  static Exceptions e;
  return e;
}

// Raises the Python twin of a C++ libreyolo::Error with its attributes.
[[noreturn]] void raise_error(const libreyolo::Error& e) {
  const Exceptions& x = exceptions();
  py::object cls = x.runtime;
  if (dynamic_cast<const libreyolo::UsageError*>(&e)) cls = x.usage;
  else if (dynamic_cast<const libreyolo::DataError*>(&e)) cls = x.data;
  else if (dynamic_cast<const libreyolo::ModelError*>(&e)) cls = x.model;
  else if (dynamic_cast<const libreyolo::InterruptedError*>(&e)) cls = x.interrupted;
  py::object err = cls(py::str(e.what()));
  err.attr("code") = e.code();
  err.attr("suggestion") = e.suggestion();
  err.attr("exit_code") = e.exit_code();
  PyErr_SetObject(cls.ptr(), err.ptr());
  throw py::error_already_set();
}

// Runs `fn` without the GIL; C++ errors surface as the package's exceptions.
template <typename Fn>
auto without_gil(Fn&& fn) {
  try {
    py::gil_scoped_release release;
    return fn();
  } catch (const libreyolo::Error& e) {
    raise_error(e);
  }
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "LibreYOLO C++: the compiled core of the libreyolo_cpp package";
  Exceptions& x = exceptions();
  x.base = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  x.base = py::module_::import("builtins").attr("type")("LibreYOLOError", py::make_tuple(x.base), py::dict());
  x.base.attr("__module__") = "libreyolo_cpp";
  const auto sub = [&](const char* name, PyObject* also) {
    py::object cls = py::module_::import("builtins")
                         .attr("type")(name, py::make_tuple(x.base, py::reinterpret_borrow<py::object>(also)),
                                       py::dict());
    cls.attr("__module__") = "libreyolo_cpp";
    return cls;
  };
  x.usage = sub("UsageError", PyExc_ValueError);
  x.data = sub("DataError", PyExc_OSError);
  x.model = sub("ModelError", PyExc_ValueError);
  x.runtime = sub("TrainingError", PyExc_RuntimeError);
  x.interrupted = sub("Interrupted", PyExc_KeyboardInterrupt);
  m.attr("LibreYOLOError") = x.base;
  m.attr("UsageError") = x.usage;
  m.attr("DataError") = x.data;
  m.attr("ModelError") = x.model;
  m.attr("TrainingError") = x.runtime;
  m.attr("Interrupted") = x.interrupted;
  m.attr("SAMPLE_IMAGE") = "SAMPLE_IMAGE";
  m.def("version", [] { return std::string(libreyolo::version()); });

  py::class_<libreyolo::LibreYOLO>(m, "Model")
      .def(py::init([](const std::string& model, const std::string& device) {
             return without_gil([&] { return std::make_unique<libreyolo::LibreYOLO>(model, device); });
           }),
           py::arg("model"), py::arg("device") = "auto")
      .def_static(
          "create",
          [](const std::string& family, const std::string& size, int nc, const std::string& device) {
            return without_gil([&] { return libreyolo::LibreYOLO::create(family, size, nc, device); });
          },
          py::arg("family"), py::arg("size"), py::arg("num_classes") = 80, py::arg("device") = "auto")
      .def(
          "predict",
          [](libreyolo::LibreYOLO& self, const std::string& source, const Kwargs& options) {
            const auto results = without_gil([&] { return self.predict(source, options); });
            py::list out;
            for (const auto& r : results) out.append(predict_dict(r));
            return out;
          },
          py::arg("source"), py::arg("options") = Kwargs{})
      .def(
          "predict_images",
          // uint8 arrays [H, W, C] (C 1, 3 or 4; pixels packed, rows at any stride), each RGB or
          // BGR (bgr[i]): the wrapper brings other layouts and dtypes to this.
          [](libreyolo::LibreYOLO& self, const std::vector<py::array>& images, const std::vector<std::string>& names,
             const std::vector<bool>& bgr, const Kwargs& options) {
            std::vector<libreyolo::ImageView> views;
            for (size_t i = 0; i < images.size(); ++i) {
              const py::array& a = images[i];
              if (!py::isinstance<py::array_t<uint8_t>>(a) || a.ndim() != 3 || a.strides(2) != 1 ||
                  a.strides(1) != a.shape(2))
                throw libreyolo::UsageError("predict: image " + std::to_string(i) +
                                                " is not a uint8 array [H, W, C] with packed pixels",
                                            "", "source_invalid");
              libreyolo::ImageView v;
              v.data = static_cast<const uint8_t*>(a.data());
              v.height = static_cast<int>(a.shape(0));
              v.width = static_cast<int>(a.shape(1));
              v.channels = static_cast<int>(a.shape(2));
              v.row_stride = a.strides(0);
              v.bgr = i < bgr.size() && bgr[i];
              if (i < names.size()) v.name = names[i];
              views.push_back(std::move(v));
            }
            const auto results = without_gil([&] { return self.predict(views, options); });
            py::list out;
            for (const auto& r : results) out.append(predict_dict(r));
            return out;
          },
          py::arg("images"), py::arg("names"), py::arg("bgr"), py::arg("options") = Kwargs{})
      .def(
          "train",
          // The callbacks run on the training thread with the GIL taken; what one raises ends the
          // training and reaches the caller.
          [](libreyolo::LibreYOLO& self, const Kwargs& options, py::object on_epoch_end, py::object on_train_start,
             py::object on_train_end) {
            libreyolo::TrainCallbacks cb;
            if (!on_epoch_end.is_none())
              cb.on_epoch_end = [on_epoch_end](const libreyolo::EpochSummary& e) {
                py::gil_scoped_acquire gil;
                on_epoch_end(epoch_dict(e));
              };
            if (!on_train_start.is_none())
              cb.on_train_start = [on_train_start](const libreyolo::TrainConfig&, const std::string& save_dir) {
                py::gil_scoped_acquire gil;
                on_train_start(save_dir);
              };
            if (!on_train_end.is_none())
              cb.on_train_end = [on_train_end](const libreyolo::TrainResult& r) {
                py::gil_scoped_acquire gil;
                on_train_end(train_dict(r));
              };
            const auto r = without_gil([&] { return self.train(options, cb); });
            return train_dict(r);
          },
          py::arg("options"), py::arg("on_epoch_end") = py::none(), py::arg("on_train_start") = py::none(),
          py::arg("on_train_end") = py::none())
      .def(
          "check_train",
          [](libreyolo::LibreYOLO& self, const Kwargs& options) {
            without_gil([&] { return self.check_train(options); });
          },
          py::arg("options"))
      .def(
          "val", [](libreyolo::LibreYOLO& self, const Kwargs& options) {
            return val_dict(without_gil([&] { return self.val(options); }));
          },
          py::arg("options") = Kwargs{})
      .def("info", [](const libreyolo::LibreYOLO& self) { return info_dict(self.info()); })
      .def(
          "save", [](const libreyolo::LibreYOLO& self, const std::string& path) {
            without_gil([&] {
              self.save(path);
              return 0;
            });
          },
          py::arg("path"));
}
