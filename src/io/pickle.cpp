// PyValue and the torch.save reader: a zip container opened with PyTorchStreamReader and a
// small pickle VM. The VM never imports or calls anything: GLOBAL only resolves names from a
// fixed allow-list into inert placeholders, and REDUCE only "calls" those placeholders.
#include "io/pickle.hpp"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <c10/core/CPUAllocator.h>

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "core/log.hpp"
#include "io/pickle_detail.hpp"
#include "io/torch_zip.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io {

// ---------------------------------------------------------------- PyValue

namespace {
PyValuePtr make_value(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

const char* kind_name(PyValue::Kind k) {
  switch (k) {
    case PyValue::Kind::None: return "None";
    case PyValue::Kind::Bool: return "bool";
    case PyValue::Kind::Int: return "int";
    case PyValue::Kind::Float: return "float";
    case PyValue::Kind::String: return "str";
    case PyValue::Kind::Bytes: return "bytes";
    case PyValue::Kind::Tuple: return "tuple";
    case PyValue::Kind::List: return "list";
    case PyValue::Kind::Dict: return "dict";
    case PyValue::Kind::Tensor: return "tensor";
  }
  return "?";
}

[[noreturn]] void type_error(const char* what, const char* expected, const PyValue& got) {
  throw ModelError(strfmt("%s must be %s, got %s", what, expected, got.repr(60).c_str()));
}

void repr_into(const PyValue& v, std::string& out, size_t max_len, int depth) {
  if (out.size() > max_len) return;
  auto seq = [&](const std::vector<PyValuePtr>& items, char open, char close) {
    out += open;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k) out += ", ";
      if (out.size() > max_len) return;
      repr_into(*items[k], out, max_len, depth + 1);
    }
    if (open == '(' && items.size() == 1) out += ',';
    out += close;
  };
  if (depth > 8 && (v.kind == PyValue::Kind::Tuple || v.kind == PyValue::Kind::List ||
                    v.kind == PyValue::Kind::Dict)) {
    out += "...";
    return;
  }
  switch (v.kind) {
    case PyValue::Kind::None: out += "None"; break;
    case PyValue::Kind::Bool: out += v.b ? "True" : "False"; break;
    case PyValue::Kind::Int: out += std::to_string(v.i); break;
    case PyValue::Kind::Float: out += strfmt("%.17g", v.f); break;
    case PyValue::Kind::String:
      out += '\'';
      out += v.s.size() > max_len ? v.s.substr(0, max_len) : v.s;
      out += '\'';
      break;
    case PyValue::Kind::Bytes: out += strfmt("b<%zu bytes>", v.s.size()); break;
    case PyValue::Kind::Tuple: seq(v.items, '(', ')'); break;
    case PyValue::Kind::List: seq(v.items, '[', ']'); break;
    case PyValue::Kind::Dict:
      out += v.ordered ? "OrderedDict{" : "{";
      for (size_t k = 0; k < v.dict.size(); ++k) {
        if (k) out += ", ";
        if (out.size() > max_len) break;
        repr_into(*v.dict[k].first, out, max_len, depth + 1);
        out += ": ";
        repr_into(*v.dict[k].second, out, max_len, depth + 1);
      }
      out += '}';
      break;
    case PyValue::Kind::Tensor: {
      if (!v.tensor.defined()) {
        out += "tensor(undefined)";
        break;
      }
      out += "tensor(";
      out += c10::toString(v.tensor.scalar_type());
      out += '[';
      for (int64_t d = 0; d < v.tensor.dim(); ++d) {
        if (d) out += ", ";
        out += std::to_string(v.tensor.size(d));
      }
      out += "])";
      break;
    }
  }
}
}  // namespace

PyValuePtr PyValue::none() { return make_value(Kind::None); }
PyValuePtr PyValue::from_bool(bool v) {
  auto p = make_value(Kind::Bool);
  p->b = v;
  return p;
}
PyValuePtr PyValue::from_int(int64_t v) {
  auto p = make_value(Kind::Int);
  p->i = v;
  return p;
}
PyValuePtr PyValue::from_float(double v) {
  auto p = make_value(Kind::Float);
  p->f = v;
  return p;
}
PyValuePtr PyValue::from_string(std::string v) {
  auto p = make_value(Kind::String);
  p->s = std::move(v);
  return p;
}
PyValuePtr PyValue::from_tensor(torch::Tensor t) {
  auto p = make_value(Kind::Tensor);
  p->tensor = std::move(t);
  return p;
}
PyValuePtr PyValue::new_list(std::vector<PyValuePtr> v) {
  auto p = make_value(Kind::List);
  p->items = std::move(v);
  return p;
}
PyValuePtr PyValue::new_tuple(std::vector<PyValuePtr> v) {
  auto p = make_value(Kind::Tuple);
  p->items = std::move(v);
  return p;
}
PyValuePtr PyValue::new_dict(bool ordered) {
  auto p = make_value(Kind::Dict);
  p->ordered = ordered;
  return p;
}

PyValuePtr PyValue::get(const std::string& key) const {
  if (kind != Kind::Dict) return nullptr;
  for (const auto& kv : dict) {
    if (kv.first->kind == Kind::String && kv.first->s == key) return kv.second;
  }
  return nullptr;
}

void PyValue::set(const std::string& key, PyValuePtr v) { set(from_string(key), std::move(v)); }

void PyValue::set(PyValuePtr key, PyValuePtr v) {
  if (kind != Kind::Dict) throw ModelError("PyValue::set called on a " + std::string(kind_name(kind)));
  std::string id;
  if (!detail::append_key_id(*key, id)) {
    throw ModelError(strfmt("unhashable dict key %s", key->repr(60).c_str()));
  }
  for (auto& kv : dict) {
    std::string other;
    if (detail::append_key_id(*kv.first, other) && other == id) {
      kv.second = std::move(v);
      return;
    }
  }
  dict.emplace_back(std::move(key), std::move(v));
}

int64_t PyValue::as_int(const char* what) const {
  if (kind == Kind::Int) return i;
  if (kind == Kind::Bool) return b ? 1 : 0;
  type_error(what, "an int", *this);
}

double PyValue::as_float(const char* what) const {
  if (kind == Kind::Float) return f;
  if (kind == Kind::Int) return static_cast<double>(i);
  if (kind == Kind::Bool) return b ? 1.0 : 0.0;
  type_error(what, "a number", *this);
}

const std::string& PyValue::as_string(const char* what) const {
  if (kind == Kind::String) return s;
  type_error(what, "a string", *this);
}

bool PyValue::as_bool(const char* what) const {
  if (kind == Kind::Bool) return b;
  if (kind == Kind::Int && (i == 0 || i == 1)) return i == 1;
  type_error(what, "a bool", *this);
}

std::string PyValue::repr(int max_len) const {
  const size_t limit = max_len > 0 ? static_cast<size_t>(max_len) : 200;
  std::string out;
  repr_into(*this, out, limit, 0);
  if (out.size() > limit) {
    out.resize(limit);
    out += "...";
  }
  return out;
}

// ---------------------------------------------------------------- shared helpers

namespace detail {

bool append_key_id(const PyValue& v, std::string& out, size_t max_len, int depth) {
  using K = PyValue::Kind;
  if (depth > 32 || out.size() > max_len) return false;
  switch (v.kind) {
    case K::None: out += 'N'; return true;
    // Python: True == 1 and 1.0 == 1 hash alike, so they are one key.
    case K::Bool: out += v.b ? "i1;" : "i0;"; return true;
    case K::Int: out += 'i' + std::to_string(v.i) + ';'; return true;
    case K::Float:
      if (std::isfinite(v.f) && v.f == std::trunc(v.f) && std::fabs(v.f) < 9.2e18) {
        out += 'i' + std::to_string(static_cast<int64_t>(v.f)) + ';';
      } else {
        uint64_t bits;
        std::memcpy(&bits, &v.f, sizeof bits);
        out += 'f' + std::to_string(bits) + ';';
      }
      return true;
    case K::String:
    case K::Bytes:
      if (v.s.size() > max_len - out.size()) return false;
      out += (v.kind == K::String ? 's' : 'b') + std::to_string(v.s.size()) + ':' + v.s;
      return true;
    case K::Tuple:
      out += '(';
      for (const auto& item : v.items) {
        if (!append_key_id(*item, out, max_len, depth + 1)) return false;
      }
      out += ')';
      return true;
    default: return false;
  }
}

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t k = 0;
  while (k < n) {
    const unsigned char c = p[k];
    size_t extra;
    if (c < 0x80) {
      ++k;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
    } else {
      return false;
    }
    if (k + extra >= n) return false;
    for (size_t e = 1; e <= extra; ++e) {
      if ((p[k + e] & 0xC0) != 0x80) return false;
    }
    // Overlong three/four-byte forms and code points above U+10FFFF. Encoded surrogates are
    // let through: Python writes them with 'surrogatepass'.
    if (c == 0xE0 && p[k + 1] < 0xA0) return false;
    if (c == 0xF0 && p[k + 1] < 0x90) return false;
    if (c == 0xF4 && p[k + 1] > 0x8F) return false;
    k += extra + 1;
  }
  return true;
}

std::string printable(const std::string& s, size_t max_len) {
  std::string out;
  for (char ch : s) {
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7F) ? ch : '?';
  }
  return out;
}

void throw_corrupt(const std::string& name, const std::string& what) {
  throw ModelError(strfmt("checkpoint '%s' is corrupt: %s", name.c_str(), what.c_str()),
                   "The file may be truncated or damaged; save or download it again.");
}

}  // namespace detail

// ---------------------------------------------------------------- the pickle VM

namespace {

using detail::printable;
using detail::throw_corrupt;

// Bounds on what one checkpoint may make the reader allocate. Real LibreYOLO checkpoints stay
// far below them (yolo9-t: a 100 kB pickle, about 40k objects, nesting depth 4).
constexpr size_t kMaxPickleBytes = size_t(256) << 20;
constexpr size_t kMaxObjects = 4'000'000;
constexpr size_t kMaxStack = 4'000'000;
constexpr size_t kMaxMemo = 4'000'000;
constexpr size_t kMaxMarks = 4096;
constexpr int kMaxDepth = 512;
constexpr size_t kMaxDims = 64;
// Dict keys are hashed on every insertion; a cap keeps a reused huge key from costing
// quadratic time.
constexpr size_t kMaxKeyBytes = 1024;
// Objects reachable from one container, counting shared ones once per reference (a string
// counts 1 + its length / 64): stops small pickles of shared references from expanding into
// exponentially large data for whoever walks it.
constexpr uint64_t kMaxWeight = 16'000'000;
// A stored zip record is never larger than the archive; deflate compresses at most ~1032:1.
constexpr uint64_t kMaxInflateRatio = 1040;

// What an allow-listed GLOBAL stands for.
enum class Callable {
  OrderedDict,
  RebuildTensorV2,
  RebuildTensorV3,
  RebuildParameter,
  RebuildParameterWithState,
  Device,
  Size,
  CodecsEncode,
  Set,
  ByteArray,
  StorageType,  // torch.<Dtype>Storage or torch.storage.UntypedStorage
  Dtype,        // torch.float32 ...
};

struct GlobalInfo {
  Callable kind;
  c10::ScalarType dtype = c10::ScalarType::Byte;
  bool untyped = false;
};

std::optional<GlobalInfo> resolve_global(const std::string& module, const std::string& name) {
  using ST = c10::ScalarType;
  if (module == "collections" && name == "OrderedDict") return GlobalInfo{Callable::OrderedDict};
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") return GlobalInfo{Callable::RebuildTensorV2};
    if (name == "_rebuild_tensor_v3") return GlobalInfo{Callable::RebuildTensorV3};
    if (name == "_rebuild_parameter") return GlobalInfo{Callable::RebuildParameter};
    if (name == "_rebuild_parameter_with_state") {
      return GlobalInfo{Callable::RebuildParameterWithState};
    }
    return std::nullopt;
  }
  if (module == "_codecs" && name == "encode") return GlobalInfo{Callable::CodecsEncode};
  if (module == "builtins") {
    if (name == "set" || name == "frozenset") return GlobalInfo{Callable::Set};
    if (name == "bytearray") return GlobalInfo{Callable::ByteArray};
    return std::nullopt;
  }
  if (module == "torch.storage" && name == "UntypedStorage") {
    return GlobalInfo{Callable::StorageType, ST::Byte, true};
  }
  if (module == "torch" || module == "torch.cuda") {
    static const std::unordered_map<std::string, ST> storages = {
        {"DoubleStorage", ST::Double},      {"FloatStorage", ST::Float},
        {"HalfStorage", ST::Half},          {"BFloat16Storage", ST::BFloat16},
        {"LongStorage", ST::Long},          {"IntStorage", ST::Int},
        {"ShortStorage", ST::Short},        {"CharStorage", ST::Char},
        {"ByteStorage", ST::Byte},          {"BoolStorage", ST::Bool},
        {"ComplexFloatStorage", ST::ComplexFloat}, {"ComplexDoubleStorage", ST::ComplexDouble},
    };
    if (auto it = storages.find(name); it != storages.end()) {
      return GlobalInfo{Callable::StorageType, it->second, false};
    }
  }
  if (module == "torch") {
    if (name == "device") return GlobalInfo{Callable::Device};
    if (name == "Size") return GlobalInfo{Callable::Size};
    static const std::unordered_map<std::string, ST> dtypes = {
        {"float32", ST::Float},         {"float64", ST::Double},
        {"float16", ST::Half},          {"bfloat16", ST::BFloat16},
        {"int64", ST::Long},            {"int32", ST::Int},
        {"int16", ST::Short},           {"int8", ST::Char},
        {"uint8", ST::Byte},            {"bool", ST::Bool},
        {"complex32", ST::ComplexHalf}, {"complex64", ST::ComplexFloat},
        {"complex128", ST::ComplexDouble}, {"uint16", ST::UInt16},
        {"uint32", ST::UInt32},         {"uint64", ST::UInt64},
        {"float8_e4m3fn", ST::Float8_e4m3fn}, {"float8_e5m2", ST::Float8_e5m2},
        {"float8_e4m3fnuz", ST::Float8_e4m3fnuz}, {"float8_e5m2fnuz", ST::Float8_e5m2fnuz},
    };
    if (auto it = dtypes.find(name); it != dtypes.end()) {
      return GlobalInfo{Callable::Dtype, it->second, false};
    }
  }
  return std::nullopt;
}

// Reads the raw bytes of data/<key> into a new CPU storage.
using StorageLoader = std::function<c10::Storage(const std::string& key, uint64_t nbytes)>;

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t size, std::string name, StorageLoader loader)
      : p_(data), n_(size), name_(std::move(name)), loader_(std::move(loader)) {}

  PyValuePtr run();

 private:
  // Per-object bookkeeping for containers and placeholders (keyed by address; `keep` holds the
  // object so the address stays unique while the VM runs).
  struct Meta {
    PyValuePtr keep;
    int depth = 0;
    uint64_t weight = 1;
    bool sealed = false;  // stored inside another object: no longer mutable
    std::optional<GlobalInfo> global;
    bool is_storage = false;
    c10::ScalarType dtype = c10::ScalarType::Byte;  // storage reference: its declared dtype
    bool untyped = false;
    c10::Storage storage;
    std::unique_ptr<std::unordered_map<std::string, size_t>> keys;  // dict key -> index
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw_corrupt(name_, strfmt("%s (pickle byte %zu)", what.c_str(), op_pos_));
  }

  // Input.
  const uint8_t* take(uint64_t count) {
    if (count > n_ - pos_) fail(strfmt("needs %llu more bytes, %zu left", (unsigned long long)count, n_ - pos_));
    const uint8_t* at = p_ + pos_;
    pos_ += static_cast<size_t>(count);
    return at;
  }
  uint64_t read_le(int bytes) {
    const uint8_t* b = take(bytes);
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | b[k];
    return v;
  }
  std::string read_line() {
    const size_t limit = std::min<size_t>(n_ - pos_, 1024);
    const void* nl = std::memchr(p_ + pos_, '\n', limit);
    if (!nl) fail("unterminated text argument");
    const size_t len = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len + 1;
    return s;
  }

  // Objects and the stack.
  PyValuePtr make(PyValue::Kind kind) {
    if (++objects_ > kMaxObjects) fail("too many objects");
    auto v = make_value(kind);
    if (kind == PyValue::Kind::Tuple || kind == PyValue::Kind::List ||
        kind == PyValue::Kind::Dict) {
      Meta& m = meta_[v.get()];
      m.keep = v;
      if (kind == PyValue::Kind::Dict) {
        m.keys = std::make_unique<std::unordered_map<std::string, size_t>>();
      }
    }
    return v;
  }
  Meta* meta(const PyValuePtr& v) {
    auto it = meta_.find(v.get());
    return it == meta_.end() ? nullptr : &it->second;
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(PyValuePtr v) {
    if (stack_.size() >= kMaxStack) fail("stack too large");
    stack_.push_back(std::move(v));
  }
  PyValuePtr pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    PyValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const PyValuePtr& top() const {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }
  std::vector<PyValuePtr> pop_mark() {
    if (marks_.empty()) fail("missing MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyValuePtr> items(std::make_move_iterator(stack_.begin() + m),
                                  std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return items;
  }

  // Containers. A container can only be filled while it is not yet inside another object;
  // this is how torch.save writes them, and it makes reference cycles impossible.
  void check_mutable(const PyValuePtr& target, PyValue::Kind kind, const char* op) {
    if (target->kind != kind) fail(strfmt("%s on a %s", op, kind_name(target->kind)));
    Meta* m = meta(target);
    if (!m || m->global || m->is_storage) fail(strfmt("%s on a placeholder object", op));
    if (m->sealed) fail(strfmt("%s modifies an object already stored elsewhere (recursive data is not supported)", op));
  }
  void adopt(const PyValuePtr& container, const PyValuePtr& item) {
    if (item == container) fail("an object contains itself (recursive data is not supported)");
    int item_depth = 0;
    uint64_t item_weight = 1 + item->s.size() / 64;
    if (Meta* im = meta(item)) {
      im->sealed = true;
      item_depth = im->depth;
      item_weight = im->weight;
    }
    Meta* cm = meta(container);
    if (item_depth + 1 > kMaxDepth) fail(strfmt("data nested deeper than %d levels", kMaxDepth));
    cm->depth = std::max(cm->depth, item_depth + 1);
    cm->weight += item_weight;
    if (cm->weight > kMaxWeight) fail("data expands to too many objects (shared references)");
  }
  // Bytes copied by REDUCE (not bounded by the input size otherwise).
  void charge(size_t bytes) {
    copied_ += bytes;
    if (copied_ > 2 * n_ + (size_t(16) << 20)) fail("too much data built by REDUCE");
  }
  PyValuePtr make_seq(PyValue::Kind kind, std::vector<PyValuePtr> items) {
    PyValuePtr v = make(kind);
    for (const auto& item : items) adopt(v, item);
    v->items = std::move(items);
    return v;
  }
  void dict_set(const PyValuePtr& d, PyValuePtr key, PyValuePtr value) {
    std::string id;
    if (!detail::append_key_id(*key, id, kMaxKeyBytes)) {
      fail(strfmt("unhashable or oversized (over %zu bytes) dict key of type %s", kMaxKeyBytes, kind_name(key->kind)));
    }
    adopt(d, key);
    adopt(d, value);
    auto& index = *meta(d)->keys;
    auto [it, inserted] = index.emplace(std::move(id), d->dict.size());
    if (inserted) {
      d->dict.emplace_back(std::move(key), std::move(value));
    } else {
      d->dict[it->second].second = std::move(value);
    }
  }
  void dict_set_items(const PyValuePtr& d, std::vector<PyValuePtr>& items) {
    if (items.size() % 2) fail("odd number of items for a dict");
    for (size_t k = 0; k < items.size(); k += 2) dict_set(d, items[k], items[k + 1]);
  }

  // Scalars.
  PyValuePtr make_int(int64_t v) {
    PyValuePtr p = make(PyValue::Kind::Int);
    p->i = v;
    return p;
  }
  PyValuePtr make_text(PyValue::Kind kind, uint64_t len) {
    const uint8_t* b = take(len);
    PyValuePtr p = make(kind);
    p->s.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(len));
    if (kind == PyValue::Kind::String && !detail::valid_utf8(p->s)) fail("string is not valid UTF-8");
    return p;
  }
  PyValuePtr read_long(uint64_t len) {
    if (len > 8) fail(strfmt("integer of %llu bytes does not fit in 64 bits", (unsigned long long)len));
    const uint8_t* b = take(len);
    uint64_t v = 0;
    for (uint64_t k = len; k-- > 0;) v = (v << 8) | b[k];
    if (len > 0 && len < 8 && (b[len - 1] & 0x80)) v |= ~uint64_t(0) << (8 * len);  // sign-extend
    return make_int(static_cast<int64_t>(v));
  }

  // Memo.
  void memo_put(uint64_t index) {
    if (memo_.size() >= kMaxMemo && !memo_.count(index)) fail("memo too large");
    memo_[index] = top();
  }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(strfmt("memo entry %llu is missing", (unsigned long long)index));
    push(it->second);
  }
  uint64_t parse_decimal(const std::string& line) {
    if (line.empty() || line.size() > 18) fail("bad memo index");
    uint64_t v = 0;
    for (char c : line) {
      if (c < '0' || c > '9') fail("bad memo index");
      v = v * 10 + (c - '0');
    }
    return v;
  }

  // Globals, calls and tensors.
  PyValuePtr make_global(const std::string& module, const std::string& name);
  PyValuePtr call(const PyValuePtr& callable, const PyValuePtr& args, const char* op);
  PyValuePtr encode_bytes(const std::vector<PyValuePtr>& a);
  PyValuePtr persistent_load(const PyValuePtr& pid);
  PyValuePtr rebuild_tensor(const std::vector<PyValuePtr>& a, std::optional<c10::ScalarType> dtype);
  int64_t int_arg(const PyValuePtr& v, const char* what) {
    if (v->kind != PyValue::Kind::Int) fail(strfmt("%s must be an int, got %s", what, kind_name(v->kind)));
    return v->i;
  }
  std::vector<int64_t> int_tuple(const PyValuePtr& v, const char* what) {
    if (v->kind != PyValue::Kind::Tuple && v->kind != PyValue::Kind::List) {
      fail(strfmt("%s must be a tuple, got %s", what, kind_name(v->kind)));
    }
    if (v->items.size() > kMaxDims) fail(strfmt("%s has %zu dimensions", what, v->items.size()));
    std::vector<int64_t> out;
    out.reserve(v->items.size());
    for (const auto& item : v->items) {
      const int64_t x = int_arg(item, what);
      if (x < 0) fail(strfmt("%s has a negative entry", what));
      out.push_back(x);
    }
    return out;
  }
  const Meta* global_of(const PyValuePtr& v) {
    Meta* m = meta(v);
    return (m && m->global) ? m : nullptr;
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;
  std::string name_;
  StorageLoader loader_;
  std::vector<PyValuePtr> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyValuePtr> memo_;
  std::unordered_map<const PyValue*, Meta> meta_;
  std::unordered_map<std::string, c10::Storage> storages_;
  size_t objects_ = 0;
  size_t copied_ = 0;
};

PyValuePtr Unpickler::make_global(const std::string& raw_module, const std::string& name) {
  // Protocol 2 writes some Python 3 modules under their Python 2 names (fix_imports).
  std::string module = raw_module;
  if (module == "__builtin__") module = "builtins";
  if (module == "commands") module = "subprocess";
  if (module == "copy_reg") module = "copyreg";
  auto info = resolve_global(module, name);
  if (!info) {
    throw ModelError(
        strfmt("checkpoint '%s' refers to a disallowed Python global '%s.%s'; only plain data and "
               "tensors can be loaded",
               name_.c_str(), printable(module, 100).c_str(), printable(name, 100).c_str()),
        "Load only files from sources you trust, or re-save the weights as a plain state dict.");
  }
  // A placeholder that reads as the global's dotted name if it ends up in the result.
  PyValuePtr v = make(PyValue::Kind::String);
  v->s = module + "." + name;
  Meta& m = meta_[v.get()];
  m.keep = v;
  m.global = info;
  return v;
}

PyValuePtr Unpickler::persistent_load(const PyValuePtr& pid) {
  if (pid->kind != PyValue::Kind::Tuple || pid->items.size() != 5) {
    fail("persistent id is not a ('storage', type, key, location, numel) tuple");
  }
  const auto& it = pid->items;
  if (it[0]->kind != PyValue::Kind::String || it[0]->s != "storage") {
    fail("persistent id does not name a storage");
  }
  const Meta* type = global_of(it[1]);
  if (!type || type->global->kind != Callable::StorageType) fail("persistent id has no storage type");
  if (it[2]->kind != PyValue::Kind::String || it[2]->s.empty() || it[2]->s.size() > 256) {
    fail("persistent id has a bad storage key");
  }
  // The location (cpu, cuda:0, mps ...) is ignored: everything is loaded on the CPU.
  if (it[3]->kind != PyValue::Kind::String) fail("persistent id has a bad location");
  const int64_t numel = int_arg(it[4], "storage size");
  if (numel < 0) fail("negative storage size");
  const c10::ScalarType dtype = type->global->dtype;
  const bool untyped = type->global->untyped;
  const uint64_t item = untyped ? 1 : c10::elementSize(dtype);
  if (static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / 8 / item) {
    fail("storage size overflows");
  }
  const uint64_t nbytes = static_cast<uint64_t>(numel) * item;
  const std::string& key = it[2]->s;
  auto found = storages_.find(key);
  if (found == storages_.end()) {
    found = storages_.emplace(key, loader_(key, nbytes)).first;
  }
  // The reference is a flat tensor over the whole storage, so a bare storage in the data
  // comes out as a 1-D tensor; _rebuild_tensor_* uses the storage itself.
  const c10::Storage& storage = found->second;
  const c10::ScalarType flat_type = untyped ? c10::ScalarType::Byte : dtype;
  const int64_t flat_numel = static_cast<int64_t>(storage.nbytes() / c10::elementSize(flat_type));
  PyValuePtr v = make(PyValue::Kind::Tensor);
  v->tensor = at::empty({0}, at::TensorOptions().dtype(flat_type)).set_(storage, 0, {flat_numel}, {1});
  Meta& m = meta_[v.get()];
  m.keep = v;
  m.is_storage = true;
  m.dtype = dtype;
  m.untyped = untyped;
  m.storage = storage;
  return v;
}

// args: storage, storage_offset, size, stride, requires_grad, backward_hooks[, dtype][, metadata]
PyValuePtr Unpickler::rebuild_tensor(const std::vector<PyValuePtr>& a,
                                     std::optional<c10::ScalarType> dtype) {
  Meta* st = meta(a[0]);
  if (!st || !st->is_storage) fail("tensor is not built from a storage");
  if (!dtype) {
    if (st->untyped) fail("_rebuild_tensor_v2 on an untyped storage");
    dtype = st->dtype;
  }
  const int64_t offset = int_arg(a[1], "storage offset");
  if (offset < 0) fail("negative storage offset");
  const std::vector<int64_t> sizes = int_tuple(a[2], "tensor size");
  const std::vector<int64_t> strides = int_tuple(a[3], "tensor stride");
  if (sizes.size() != strides.size()) fail("tensor size and stride differ in length");
  const uint64_t item = c10::elementSize(*dtype);
  const int64_t storage_numel = static_cast<int64_t>(st->storage.nbytes() / item);
  // Largest element index the view touches; every step checked for overflow.
  int64_t numel = 1;
  int64_t last = offset;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (__builtin_mul_overflow(numel, sizes[d], &numel)) fail("tensor size overflows");
  }
  if (numel > 0) {
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t span;
      if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) ||
          __builtin_add_overflow(last, span, &last)) {
        fail("tensor extent overflows");
      }
    }
    if (last >= storage_numel) {
      fail(strfmt("tensor view (offset %lld, extent %lld) lies outside its storage of %lld elements",
                  (long long)offset, (long long)last + 1, (long long)storage_numel));
    }
  } else if (offset > storage_numel) {
    fail("storage offset lies outside the storage");
  }
  PyValuePtr v = make(PyValue::Kind::Tensor);
  v->tensor = at::empty({0}, at::TensorOptions().dtype(*dtype)).set_(st->storage, offset, sizes, strides);
  return v;
}

// str.encode(encoding) for the encodings pickle uses for bytes: args (str[, encoding]).
PyValuePtr Unpickler::encode_bytes(const std::vector<PyValuePtr>& a) {
  if (a[0]->kind != PyValue::Kind::String) fail("bytes are not encoded from a string");
  std::string enc = "utf-8";
  if (a.size() == 2) {
    if (a[1]->kind != PyValue::Kind::String) fail("encoding is not a string");
    enc = a[1]->s;
  }
  for (auto& c : enc) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  PyValuePtr b = make(PyValue::Kind::Bytes);
  const std::string& s = a[0]->s;
  charge(s.size());
  if (enc == "latin1" || enc == "latin-1" || enc == "iso-8859-1") {
    // The string is valid UTF-8 (checked when read); keep code points <= U+00FF as bytes.
    b->s.reserve(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      const auto c = static_cast<unsigned char>(s[k]);
      if (c < 0x80) {
        b->s += static_cast<char>(c);
      } else if ((c == 0xC2 || c == 0xC3) && k + 1 < s.size()) {
        b->s += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(s[++k]) & 0x3F));
      } else {
        fail("character outside latin-1 in encoded bytes");
      }
    }
  } else if (enc == "utf-8" || enc == "utf8") {
    b->s = s;
  } else {
    fail("bytes with an unsupported encoding '" + printable(enc, 30) + "'");
  }
  return b;
}

PyValuePtr Unpickler::call(const PyValuePtr& callable, const PyValuePtr& args, const char* op) {
  const Meta* g = global_of(callable);
  if (!g) fail(strfmt("%s on an object that is not an allowed global", op));
  if (args->kind != PyValue::Kind::Tuple) fail(strfmt("%s arguments are not a tuple", op));
  const auto& a = args->items;
  auto nargs = [&](size_t lo, size_t hi) {
    if (a.size() < lo || a.size() > hi) {
      fail(strfmt("%s called with %zu arguments", callable->s.c_str(), a.size()));
    }
  };
  switch (g->global->kind) {
    case Callable::OrderedDict: {
      nargs(0, 0);
      PyValuePtr d = make(PyValue::Kind::Dict);
      d->ordered = true;
      return d;
    }
    case Callable::RebuildTensorV2:
      nargs(6, 7);
      return rebuild_tensor(a, std::nullopt);
    case Callable::RebuildTensorV3: {
      nargs(7, 8);
      const Meta* dt = global_of(a[6]);
      if (!dt || dt->global->kind != Callable::Dtype) fail("_rebuild_tensor_v3 without a dtype");
      return rebuild_tensor(a, dt->global->dtype);
    }
    case Callable::RebuildParameter:
    case Callable::RebuildParameterWithState:
      // requires_grad, hooks and Python attributes are not restored: tensors load as data.
      nargs(g->global->kind == Callable::RebuildParameter ? 3 : 4,
            g->global->kind == Callable::RebuildParameter ? 3 : 4);
      if (a[0]->kind != PyValue::Kind::Tensor || (meta(a[0]) && meta(a[0])->is_storage)) {
        fail("parameter data is not a tensor");
      }
      return a[0];
    case Callable::Device: {
      nargs(1, 2);
      if (a[0]->kind != PyValue::Kind::String) fail("torch.device argument is not a string");
      charge(a[0]->s.size());
      PyValuePtr s = make(PyValue::Kind::String);
      s->s = a[0]->s;
      if (a.size() == 2 && a[1]->kind != PyValue::Kind::None) {
        s->s += ':' + std::to_string(int_arg(a[1], "device index"));
      }
      return s;
    }
    case Callable::Size: {
      nargs(1, 1);
      if (a[0]->kind != PyValue::Kind::Tuple && a[0]->kind != PyValue::Kind::List) {
        fail("torch.Size argument is not a sequence");
      }
      for (const auto& x : a[0]->items) int_arg(x, "torch.Size entry");
      charge(a[0]->items.size() * sizeof(PyValuePtr));
      return make_seq(PyValue::Kind::Tuple, a[0]->items);
    }
    case Callable::CodecsEncode:
      // Protocol 2 stores bytes as _codecs.encode(str, 'latin1').
      nargs(1, 2);
      return encode_bytes(a);
    case Callable::Set: {
      // Sets come out as lists (there is no set kind).
      nargs(0, 1);
      if (a.empty()) return make(PyValue::Kind::List);
      if (a[0]->kind != PyValue::Kind::List && a[0]->kind != PyValue::Kind::Tuple) {
        fail("set argument is not a sequence");
      }
      charge(a[0]->items.size() * sizeof(PyValuePtr));
      return make_seq(PyValue::Kind::List, a[0]->items);
    }
    case Callable::ByteArray: {
      // bytearray(), bytearray(b'...') or, from protocol 2, bytearray(str, 'latin-1').
      nargs(0, 2);
      if (a.empty()) return make(PyValue::Kind::Bytes);
      if (a.size() == 1 && a[0]->kind == PyValue::Kind::Bytes) {
        charge(a[0]->s.size());
        PyValuePtr b = make(PyValue::Kind::Bytes);
        b->s = a[0]->s;
        return b;
      }
      return encode_bytes(a);
    }
    case Callable::StorageType:
    case Callable::Dtype:
      break;
  }
  fail(strfmt("%s cannot be called", callable->s.c_str()));
}

PyValuePtr Unpickler::run() {
  using K = PyValue::Kind;
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = *take(1);
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t version = *take(1);
        if (version > 5) fail(strfmt("unsupported pickle protocol %d", version));
        break;
      }
      case 0x95: take(8); break;  // FRAME: only a read-ahead hint
      case '.': {                 // STOP
        PyValuePtr result = pop();
        return result;
      }
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) fail("too many open MARKs");
        marks_.push_back(stack_.size());
        break;
      case '0':  // POP (an empty frame pops its MARK, as in CPython)
        if (stack_.size() == floor() && !marks_.empty()) {
          marks_.pop_back();
        } else {
          pop();
        }
        break;
      case '1': pop_mark(); break;  // POP_MARK
      case '2': push(top()); break;  // DUP
      case 'N': push(make(K::None)); break;
      case 0x88:
      case 0x89: {  // NEWTRUE / NEWFALSE
        PyValuePtr b = make(K::Bool);
        b->b = op == 0x88;
        push(std::move(b));
        break;
      }
      case 'J': push(make_int(static_cast<int32_t>(read_le(4)))); break;  // BININT
      case 'K': push(make_int(read_le(1))); break;                        // BININT1
      case 'M': push(make_int(read_le(2))); break;                        // BININT2
      case 0x8a: push(read_long(read_le(1))); break;                      // LONG1
      case 0x8b: push(read_long(read_le(4))); break;                      // LONG4
      case 'G': {  // BINFLOAT (big-endian)
        const uint8_t* b = take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
        PyValuePtr f = make(K::Float);
        std::memcpy(&f->f, &bits, sizeof bits);
        push(std::move(f));
        break;
      }
      case 'X': push(make_text(K::String, read_le(4))); break;     // BINUNICODE
      case 0x8c: push(make_text(K::String, read_le(1))); break;    // SHORT_BINUNICODE
      case 0x8d: push(make_text(K::String, read_le(8))); break;    // BINUNICODE8
      case 'T': {                                                  // BINSTRING
        const auto len = static_cast<int32_t>(read_le(4));
        if (len < 0) fail("negative string length");
        push(make_text(K::String, static_cast<uint64_t>(len)));
        break;
      }
      case 'U': push(make_text(K::String, read_le(1))); break;     // SHORT_BINSTRING
      case 'B': push(make_text(K::Bytes, read_le(4))); break;      // BINBYTES
      case 'C': push(make_text(K::Bytes, read_le(1))); break;      // SHORT_BINBYTES
      case 0x8e:                                                   // BINBYTES8
      case 0x96: push(make_text(K::Bytes, read_le(8))); break;     // BYTEARRAY8
      case ')': push(make(K::Tuple)); break;                       // EMPTY_TUPLE
      case 't': push(make_seq(K::Tuple, pop_mark())); break;       // TUPLE
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t count = op - 0x84;
        if (stack_.size() < floor() + count) fail("stack underflow");
        std::vector<PyValuePtr> items(std::make_move_iterator(stack_.end() - count),
                                      std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - count);
        push(make_seq(K::Tuple, std::move(items)));
        break;
      }
      case ']': push(make(K::List)); break;                   // EMPTY_LIST
      case 'l': push(make_seq(K::List, pop_mark())); break;   // LIST
      case 0x8f: push(make(K::List)); break;                  // EMPTY_SET (as a list)
      case 0x91: push(make_seq(K::List, pop_mark())); break;  // FROZENSET (as a list)
      case 'a': {                                             // APPEND
        PyValuePtr v = pop();
        const PyValuePtr& list = top();
        check_mutable(list, K::List, "APPEND");
        adopt(list, v);
        list->items.push_back(std::move(v));
        break;
      }
      case 'e':      // APPENDS
      case 0x90: {   // ADDITEMS (sets are lists)
        std::vector<PyValuePtr> items = pop_mark();
        const PyValuePtr& list = top();
        check_mutable(list, K::List, op == 'e' ? "APPENDS" : "ADDITEMS");
        for (const auto& v : items) adopt(list, v);
        list->items.insert(list->items.end(), std::make_move_iterator(items.begin()),
                           std::make_move_iterator(items.end()));
        break;
      }
      case '}': push(make(K::Dict)); break;  // EMPTY_DICT
      case 'd': {                            // DICT
        std::vector<PyValuePtr> items = pop_mark();
        PyValuePtr d = make(K::Dict);
        dict_set_items(d, items);
        push(std::move(d));
        break;
      }
      case 's': {  // SETITEM
        PyValuePtr value = pop();
        PyValuePtr key = pop();
        const PyValuePtr& d = top();
        check_mutable(d, K::Dict, "SETITEM");
        dict_set(d, std::move(key), std::move(value));
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<PyValuePtr> items = pop_mark();
        const PyValuePtr& d = top();
        check_mutable(d, K::Dict, "SETITEMS");
        dict_set_items(d, items);
        break;
      }
      case 'c': {  // GLOBAL
        std::string module = read_line();
        std::string name = read_line();
        push(make_global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        PyValuePtr name = pop();
        PyValuePtr module = pop();
        if (name->kind != K::String || module->kind != K::String || global_of(name) || global_of(module)) {
          fail("STACK_GLOBAL arguments are not strings");
        }
        push(make_global(module->s, name->s));
        break;
      }
      case 'R': {  // REDUCE
        PyValuePtr args = pop();
        PyValuePtr callable = pop();
        push(call(callable, args, "REDUCE"));
        break;
      }
      case 0x81: {  // NEWOBJ
        PyValuePtr args = pop();
        PyValuePtr cls = pop();
        push(call(cls, args, "NEWOBJ"));
        break;
      }
      case 0x92: {  // NEWOBJ_EX
        PyValuePtr kwargs = pop();
        PyValuePtr args = pop();
        PyValuePtr cls = pop();
        if (kwargs->kind != K::Dict || !kwargs->dict.empty()) fail("NEWOBJ_EX with keyword arguments");
        push(call(cls, args, "NEWOBJ_EX"));
        break;
      }
      case 'b': {  // BUILD: OrderedDict._metadata, tensor attributes: the state is dropped
        pop();
        const PyValuePtr& target = top();
        Meta* m = meta(target);
        const bool plain_dict = target->kind == K::Dict;
        const bool tensor = target->kind == K::Tensor && !(m && m->is_storage);
        if (!plain_dict && !tensor) fail(strfmt("BUILD on a %s", kind_name(target->kind)));
        break;
      }
      case 'Q': push(persistent_load(pop())); break;  // BINPERSID
      case 'q': memo_put(read_le(1)); break;          // BINPUT
      case 'r': memo_put(read_le(4)); break;          // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;       // MEMOIZE
      case 'p': memo_put(parse_decimal(read_line())); break;  // PUT
      case 'h': memo_get(read_le(1)); break;          // BINGET
      case 'j': memo_get(read_le(4)); break;          // LONG_BINGET
      case 'g': memo_get(parse_decimal(read_line())); break;  // GET
      default:
        fail(strfmt("unsupported pickle opcode 0x%02x", op));
    }
  }
}

// ---------------------------------------------------------------- the zip container

// Size of a record, refused when larger than the archive could hold.
uint64_t record_size(caffe2::serialize::PyTorchStreamReader& reader, const detail::ZipIndex& index,
                     const std::string& record, uint64_t archive_size, const std::string& name) {
  index.check_readable(record);
  const uint64_t size = reader.getRecordSize(record);
  if (size > std::max<uint64_t>(archive_size, 1) * kMaxInflateRatio) {
    throw_corrupt(name, strfmt("record '%s' declares %llu bytes, more than the file can hold",
                               printable(record, 300).c_str(), (unsigned long long)size));
  }
  return size;
}

PyValuePtr read_archive(caffe2::serialize::PyTorchStreamReader& reader, const detail::ZipIndex& index,
                        uint64_t archive_size, const std::string& name) {
  if (reader.hasRecord("byteorder")) {
    const uint64_t n = record_size(reader, index, "byteorder", archive_size, name);
    if (n > 16) throw_corrupt(name, "bad byteorder record");
    auto [ptr, size] = reader.getRecord("byteorder");
    const std::string order(static_cast<const char*>(ptr.get()), size);
    if (order == "big") {
      throw ModelError(strfmt("checkpoint '%s' was saved on a big-endian machine, which is not supported",
                              name.c_str()));
    }
    if (order != "little") throw_corrupt(name, "unknown byteorder '" + printable(order, 16) + "'");
  }
  const uint64_t pkl_size = record_size(reader, index, "data.pkl", archive_size, name);
  if (pkl_size > kMaxPickleBytes) throw_corrupt(name, "data.pkl is unreasonably large");
  auto [pkl, pkl_n] = reader.getRecord("data.pkl");

  auto loader = [&](const std::string& key, uint64_t nbytes) {
    const std::string record = "data/" + key;
    const uint64_t size = record_size(reader, index, record, archive_size, name);
    if (size != nbytes) {
      throw_corrupt(name, strfmt("record '%s' holds %llu bytes, its tensor needs %llu",
                                 printable(record, 300).c_str(), (unsigned long long)size,
                                 (unsigned long long)nbytes));
    }
    c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(nbytes),
                         c10::GetCPUAllocator(), /*resizable=*/false);
    if (nbytes > 0) reader.getRecord(record, storage.mutable_data(), static_cast<size_t>(nbytes));
    return storage;
  };
  Unpickler vm(static_cast<const uint8_t*>(pkl.get()), pkl_n, name, loader);
  return vm.run();
}

// Runs `f`, turning every failure other than our own errors into "corrupt".
template <class F>
PyValuePtr guarded(const std::string& name, F&& f) {
  try {
    return f();
  } catch (const libreyolo::Error&) {
    throw;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    // miniz errors carry a long generic advice paragraph; keep the first sentence.
    if (auto cut = msg.find(". This is an internal miniz error"); cut != std::string::npos) msg.resize(cut);
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw_corrupt(name, msg);
  } catch (const std::bad_alloc&) {
    throw_corrupt(name, "out of memory while reading it");
  } catch (const std::exception& e) {
    throw_corrupt(name, e.what());
  }
}

PyValuePtr load_archive(const std::shared_ptr<caffe2::serialize::ReadAdapterInterface>& in, const std::string& name) {
  // The legacy (torch < 1.6) format is a bare pickle stream starting with a pickled magic number.
  unsigned char head[2] = {0, 0};
  if (in->size() >= 2 && in->read(0, head, 2) == 2 && head[0] == 0x80 && head[1] <= 5) {
    throw ModelError(strfmt("checkpoint '%s' uses the legacy (pre-zip) torch.save format, which is not supported",
                            name.c_str()),
                     "Re-save it with torch >= 1.6 (without _use_new_zipfile_serialization=False).");
  }
  return guarded(name, [&] {
    const detail::ZipIndex index = detail::ZipIndex::check(*in, name);
    caffe2::serialize::PyTorchStreamReader reader(in);
    return read_archive(reader, index, in->size(), name);
  });
}

}  // namespace

PyValuePtr load_torch_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) {
    throw ModelError(strfmt("checkpoint '%s' not found", path.c_str()), "Check the path.", "checkpoint_not_found");
  }
  return load_archive(detail::file_adapter(path), path);
}

PyValuePtr load_torch_bytes(const std::string& bytes, const std::string& name) {
  return load_archive(detail::memory_adapter(bytes), name);
}

StateDict to_state_dict(const PyValue& dict, const char* what) {
  if (dict.kind != PyValue::Kind::Dict) {
    throw ModelError(strfmt("%s must be a dict of tensors, got %s", what, dict.repr(60).c_str()));
  }
  StateDict sd;
  sd.reserve(dict.dict.size());
  for (const auto& [key, value] : dict.dict) {
    if (key->kind != PyValue::Kind::String) {
      throw ModelError(strfmt("%s has a non-string key %s", what, key->repr(60).c_str()));
    }
    if (value->kind != PyValue::Kind::Tensor || !value->tensor.defined()) {
      throw ModelError(strfmt("%s['%s'] is not a tensor (got %s)", what, key->s.c_str(),
                              value->repr(60).c_str()));
    }
    sd.emplace_back(key->s, value->tensor);
  }
  return sd;
}

PyValuePtr from_state_dict(const StateDict& sd) {
  PyValuePtr d = PyValue::new_dict(true);
  d->dict.reserve(sd.size());
  for (const auto& [name, tensor] : sd) {
    d->dict.emplace_back(PyValue::from_string(name), PyValue::from_tensor(tensor));
  }
  return d;
}

}  // namespace libreyolo::io
