#include "data/dataset_yaml.hpp"
#include "core/env.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "io/image.hpp"

namespace fs = std::filesystem;

namespace libreyolo::data {
namespace {

std::string home_dir() {
  const char* home = std::getenv("HOME");
  return (home && *home) ? home : "/";
}

fs::path expand_user(const std::string& p) {
  if (p == "~") return home_dir();
  if (p.rfind("~/", 0) == 0) return fs::path(home_dir()) / p.substr(2);
  return p;
}

std::string normal(const fs::path& p) { return fs::absolute(p).lexically_normal().string(); }

std::string scalar_string(const YAML::Node& node, const std::string& key, const std::string& file) {
  if (!node.IsScalar())
    throw DataError(strfmt("%s: '%s' must be a string path", file.c_str(), key.c_str()));
  return node.as<std::string>();
}

// One class name: a scalar (a list or a mapping there is a mistake in the file, said so).
std::string class_name(const YAML::Node& n, const std::string& file, const std::string& where) {
  if (!n.IsScalar())
    throw DataError(strfmt("%s: names %s must be a name (text), not a %s", file.c_str(), where.c_str(),
                           n.IsSequence() ? "list" : n.IsMap() ? "mapping" : "null"));
  return n.as<std::string>();
}

std::vector<std::string> parse_names(const YAML::Node& node, const std::string& file) {
  std::vector<std::string> names;
  if (!node || node.IsNull()) return names;
  if (node.IsSequence()) {
    if (node.size() > static_cast<size_t>(kMaxClasses))
      throw DataError(strfmt("%s: 'names' lists %zu classes; at most %d are supported", file.c_str(),
                             static_cast<size_t>(node.size()), kMaxClasses));
    for (const auto& n : node) names.push_back(class_name(n, file, strfmt("entry %zu", names.size())));
  } else if (node.IsMap()) {
    std::map<int, std::string> by_id;
    for (const auto& kv : node) {
      int id = -1;
      try {
        id = kv.first.as<int>();
      } catch (const YAML::Exception&) {
      }
      if (id < 0)
        throw DataError(strfmt("%s: names keys must be class ids 0, 1, ... (got '%s')", file.c_str(),
                               kv.first.IsScalar() ? kv.first.as<std::string>().c_str() : "a list or mapping"));
      if (id >= kMaxClasses)
        throw DataError(strfmt("%s: names has class id %d; ids must be below %d (at most %d classes)",
                               file.c_str(), id, kMaxClasses, kMaxClasses));
      by_id[id] = class_name(kv.second, file, strfmt("id %d", id));
    }
    if (!by_id.empty()) {
      names.resize(static_cast<size_t>(by_id.rbegin()->first) + 1);
      for (size_t i = 0; i < names.size(); ++i) names[i] = "class" + std::to_string(i);
      for (const auto& [id, name] : by_id) names[static_cast<size_t>(id)] = name;
    }
  } else {
    throw DataError(file + ": 'names' must be a list or a {id: name} mapping");
  }
  return names;
}

// Reads a .txt image list: one path per line, relative to the list's folder; '#' lines skipped.
void read_list_file(const fs::path& list, std::vector<std::string>& out) {
  std::ifstream in(list);
  if (!in) throw DataError("cannot read image list " + list.string(), "", "data_not_found");
  const fs::path base = list.parent_path();
  std::string line;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const auto e = line.find_last_not_of(" \t\r");
    fs::path p = expand_user(line.substr(b, e - b + 1));
    if (p.is_relative()) p = base / p;
    out.push_back(normal(p));
  }
}

void scan_directory(const fs::path& dir, std::vector<std::string>& out) {
  std::vector<std::string> found;
  int64_t unread = 0;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  if (ec) throw DataError("cannot read directory " + dir.string() + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw DataError("cannot read directory " + dir.string() + ": " + ec.message());
    const auto& entry = *it;
    if (!entry.is_regular_file(ec)) continue;
    const std::string p = entry.path().string();
    if (io::has_image_extension(p)) found.push_back(normal(entry.path()));
    unread += io::has_unread_image_extension(p);
  }
  if (unread > 0)
    log_warn(strfmt("%s: %lld image(s) in formats this build does not read (GIF, TIFF, WebP, ...) are skipped; "
                    "JPEG, PNG and BMP are read",
                    dir.string().c_str(), static_cast<long long>(unread)));
  std::sort(found.begin(), found.end());
  out.insert(out.end(), found.begin(), found.end());
}

}  // namespace

std::string datasets_dir() {
  const char* env = env_get("LIBREYOLO_DATASETS_DIR");
  if (env && *env) return expand_user(env).string();
  return (fs::path(home_dir()) / "datasets").string();
}

DatasetSpec load_dataset_yaml(const std::string& yaml_path) {
  const fs::path yp = expand_user(yaml_path);
  std::error_code ec;
  if (!fs::is_regular_file(yp, ec))
    throw DataError("dataset YAML not found: " + yaml_path,
                    "pass data=<path to a data.yaml> (or data=builtin for the bundled dataset)",
                    "data_not_found");
  YAML::Node loaded;
  try {
    loaded = YAML::LoadFile(yp.string());
  } catch (const YAML::Exception& e) {
    throw DataError("cannot parse dataset YAML " + yaml_path + ": " + e.what());
  }
  const YAML::Node& doc = loaded;  // const: looking up a missing key must not insert it
  if (!doc.IsMap()) throw DataError("dataset YAML " + yaml_path + " is not a mapping");

  DatasetSpec spec;
  spec.yaml_path = normal(yp);
  const fs::path yaml_dir = fs::path(spec.yaml_path).parent_path();

  fs::path root = yaml_dir;
  if (doc["path"] && !doc["path"].IsNull()) {
    const fs::path p = expand_user(scalar_string(doc["path"], "path", yaml_path));
    if (p.is_absolute()) {
      root = p;
    } else {
      const fs::path under_datasets = fs::path(datasets_dir()) / p;
      root = fs::exists(under_datasets, ec) ? under_datasets : yaml_dir / p;
    }
  }
  spec.root = normal(root);

  for (const char* split : {"train", "val", "test"}) {
    const YAML::Node node = doc[split];
    if (!node || node.IsNull()) continue;
    std::vector<std::string> sources;
    auto add = [&](const YAML::Node& n) {
      fs::path p = expand_user(scalar_string(n, split, yaml_path));
      if (p.is_relative()) p = fs::path(spec.root) / p;
      sources.push_back(normal(p));
    };
    if (node.IsSequence()) {
      for (const auto& n : node) add(n);
    } else {
      add(node);
    }
    if (!sources.empty()) spec.splits[split] = std::move(sources);
  }

  spec.names = parse_names(doc["names"], yaml_path);
  int nc = -1;
  if (doc["nc"] && !doc["nc"].IsNull()) {
    const YAML::Node& n = doc["nc"];
    const std::string text = n.IsScalar() ? n.Scalar() : std::string("(not a number)");
    long long value = 0;
    try {
      value = n.as<long long>();
    } catch (const YAML::Exception&) {
      throw DataError(yaml_path + ": 'nc' must be an integer (got " + text + ")",
                      "set nc to the number of classes, or remove it and list the names");
    }
    if (value <= 0 || value > kMaxClasses)
      throw DataError(yaml_path + ": 'nc' is " + text + "; it must be between 1 and " +
                          std::to_string(kMaxClasses) + " (the number of classes)",
                      "set nc to the number of classes, or remove it and list the names");
    nc = static_cast<int>(value);
  }
  if (nc < 0 && spec.names.empty())
    throw DataError(yaml_path + " has neither 'names' nor 'nc'",
                    "add names: [class0, class1, ...] to the YAML");
  if (nc < 0) nc = static_cast<int>(spec.names.size());
  if (!spec.names.empty() && static_cast<int>(spec.names.size()) != nc)
    log_warn(strfmt("%s: nc=%d but %zu names; using nc=%d", yaml_path.c_str(), nc,
                    spec.names.size(), nc));
  while (static_cast<int>(spec.names.size()) < nc)
    spec.names.push_back("class" + std::to_string(spec.names.size()));
  spec.names.resize(static_cast<size_t>(nc));
  spec.nc = nc;
  return spec;
}

std::vector<std::string> list_images(const std::vector<std::string>& sources,
                                     const std::string& what) {
  std::vector<std::string> images;
  for (const auto& s : sources) {
    std::error_code ec;
    const fs::path p(s);
    if (fs::is_directory(p, ec)) {
      scan_directory(p, images);
    } else if (fs::is_regular_file(p, ec)) {
      if (p.extension() == ".txt")
        read_list_file(p, images);
      else
        images.push_back(normal(p));
    } else {
      throw DataError(what + " path not found: " + s,
                      "check the dataset root ('path') and the split entries of the YAML",
                      "data_not_found");
    }
  }
  if (images.empty())
    throw DataError("no images found for " + what + " in " + [&] {
      std::string joined;
      for (const auto& s : sources) joined += (joined.empty() ? "" : ", ") + s;
      return joined;
    }());
  return images;
}

std::vector<std::string> list_split_images(const DatasetSpec& spec, const std::string& split) {
  const auto it = spec.splits.find(split);
  if (it == spec.splits.end())
    throw DataError("dataset YAML " + spec.yaml_path + " has no '" + split + "' split", "",
                    "data_not_found");
  return list_images(it->second, "'" + split + "' split");
}

}  // namespace libreyolo::data
