// The pickle VM behind the torch.save reader. It never imports or calls anything: GLOBAL only
// resolves names from a fixed allow-list into inert placeholders, and REDUCE only "calls" those
// placeholders.
#include "io/unpickler.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>

#include "core/log.hpp"
#include "core/strings.hpp"
#include "io/io_detail.hpp"
#include "io/pickle_allowlist.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io::detail {
namespace {

// Bounds on what one checkpoint may make the reader allocate. Real LibreYOLO checkpoints stay
// far below them (a 3M-parameter detector: a 100 kB pickle, about 40k objects, nesting depth 4).
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

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t size, std::string name, StorageLoader loader)
      : p_(data), n_(size), name_(std::move(name)), loader_(std::move(loader)) {}

  PyValuePtr run();

 private:
  // The opcode groups of run(): each executes an opcode of its group and returns true, or
  // returns false for an opcode of another group.
  bool stack_op(uint8_t op);
  bool scalar_op(uint8_t op);
  bool sequence_op(uint8_t op);
  bool dict_op(uint8_t op);
  bool object_op(uint8_t op);
  bool memo_op(uint8_t op);

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
    auto v = std::make_shared<PyValue>();
    v->kind = kind;
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
    enc = lower(a[1]->s);
  }
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

// Framing and the stack: PROTO, FRAME, MARK, POP, POP_MARK, DUP.
bool Unpickler::stack_op(uint8_t op) {
  switch (op) {
    case 0x80: {  // PROTO
      const uint8_t version = *take(1);
      if (version > 5) fail(strfmt("unsupported pickle protocol %d", version));
      return true;
    }
    case 0x95: take(8); return true;  // FRAME: only a read-ahead hint
    case '(':                         // MARK
      if (marks_.size() >= kMaxMarks) fail("too many open MARKs");
      marks_.push_back(stack_.size());
      return true;
    case '0':  // POP (an empty frame pops its MARK, as in CPython)
      if (stack_.size() == floor() && !marks_.empty()) {
        marks_.pop_back();
      } else {
        pop();
      }
      return true;
    case '1': pop_mark(); return true;   // POP_MARK
    case '2': push(top()); return true;  // DUP
    default:
      return false;
  }
}

// Scalars: None, bools, ints, floats, strings and bytes.
bool Unpickler::scalar_op(uint8_t op) {
  using K = PyValue::Kind;
  switch (op) {
    case 'N': push(make(K::None)); return true;
    case 0x88:
    case 0x89: {  // NEWTRUE / NEWFALSE
      PyValuePtr b = make(K::Bool);
      b->b = op == 0x88;
      push(std::move(b));
      return true;
    }
    case 'J': push(make_int(static_cast<int32_t>(read_le(4)))); return true;  // BININT
    case 'K': push(make_int(read_le(1))); return true;                        // BININT1
    case 'M': push(make_int(read_le(2))); return true;                        // BININT2
    case 0x8a: push(read_long(read_le(1))); return true;                      // LONG1
    case 0x8b: push(read_long(read_le(4))); return true;                      // LONG4
    case 'G': {  // BINFLOAT (big-endian)
      const uint8_t* b = take(8);
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = (bits << 8) | b[k];
      PyValuePtr f = make(K::Float);
      std::memcpy(&f->f, &bits, sizeof bits);
      push(std::move(f));
      return true;
    }
    case 'X': push(make_text(K::String, read_le(4))); return true;   // BINUNICODE
    case 0x8c: push(make_text(K::String, read_le(1))); return true;  // SHORT_BINUNICODE
    case 0x8d: push(make_text(K::String, read_le(8))); return true;  // BINUNICODE8
    case 'T': {                                                      // BINSTRING
      const auto len = static_cast<int32_t>(read_le(4));
      if (len < 0) fail("negative string length");
      push(make_text(K::String, static_cast<uint64_t>(len)));
      return true;
    }
    case 'U': push(make_text(K::String, read_le(1))); return true;  // SHORT_BINSTRING
    case 'B': push(make_text(K::Bytes, read_le(4))); return true;   // BINBYTES
    case 'C': push(make_text(K::Bytes, read_le(1))); return true;   // SHORT_BINBYTES
    case 0x8e:                                                      // BINBYTES8
    case 0x96: push(make_text(K::Bytes, read_le(8))); return true;  // BYTEARRAY8
    default:
      return false;
  }
}

// Tuples, lists and sets (sets are lists).
bool Unpickler::sequence_op(uint8_t op) {
  using K = PyValue::Kind;
  switch (op) {
    case ')': push(make(K::Tuple)); return true;                  // EMPTY_TUPLE
    case 't': push(make_seq(K::Tuple, pop_mark())); return true;  // TUPLE
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      const size_t count = op - 0x84;
      if (stack_.size() < floor() + count) fail("stack underflow");
      std::vector<PyValuePtr> items(std::make_move_iterator(stack_.end() - count),
                                    std::make_move_iterator(stack_.end()));
      stack_.resize(stack_.size() - count);
      push(make_seq(K::Tuple, std::move(items)));
      return true;
    }
    case ']': push(make(K::List)); return true;                   // EMPTY_LIST
    case 'l': push(make_seq(K::List, pop_mark())); return true;   // LIST
    case 0x8f: push(make(K::List)); return true;                  // EMPTY_SET (as a list)
    case 0x91: push(make_seq(K::List, pop_mark())); return true;  // FROZENSET (as a list)
    case 'a': {                                                   // APPEND
      PyValuePtr v = pop();
      const PyValuePtr& list = top();
      check_mutable(list, K::List, "APPEND");
      adopt(list, v);
      list->items.push_back(std::move(v));
      return true;
    }
    case 'e':     // APPENDS
    case 0x90: {  // ADDITEMS (sets are lists)
      std::vector<PyValuePtr> items = pop_mark();
      const PyValuePtr& list = top();
      check_mutable(list, K::List, op == 'e' ? "APPENDS" : "ADDITEMS");
      for (const auto& v : items) adopt(list, v);
      list->items.insert(list->items.end(), std::make_move_iterator(items.begin()),
                         std::make_move_iterator(items.end()));
      return true;
    }
    default:
      return false;
  }
}

// Dicts.
bool Unpickler::dict_op(uint8_t op) {
  using K = PyValue::Kind;
  switch (op) {
    case '}': push(make(K::Dict)); return true;  // EMPTY_DICT
    case 'd': {                                  // DICT
      std::vector<PyValuePtr> items = pop_mark();
      PyValuePtr d = make(K::Dict);
      dict_set_items(d, items);
      push(std::move(d));
      return true;
    }
    case 's': {  // SETITEM
      PyValuePtr value = pop();
      PyValuePtr key = pop();
      const PyValuePtr& d = top();
      check_mutable(d, K::Dict, "SETITEM");
      dict_set(d, std::move(key), std::move(value));
      return true;
    }
    case 'u': {  // SETITEMS
      std::vector<PyValuePtr> items = pop_mark();
      const PyValuePtr& d = top();
      check_mutable(d, K::Dict, "SETITEMS");
      dict_set_items(d, items);
      return true;
    }
    default:
      return false;
  }
}

// Globals, calls, BUILD and persistent ids (storages).
bool Unpickler::object_op(uint8_t op) {
  using K = PyValue::Kind;
  switch (op) {
    case 'c': {  // GLOBAL
      std::string module = read_line();
      std::string name = read_line();
      push(make_global(module, name));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      PyValuePtr name = pop();
      PyValuePtr module = pop();
      if (name->kind != K::String || module->kind != K::String || global_of(name) || global_of(module)) {
        fail("STACK_GLOBAL arguments are not strings");
      }
      push(make_global(module->s, name->s));
      return true;
    }
    case 'R': {  // REDUCE
      PyValuePtr args = pop();
      PyValuePtr callable = pop();
      push(call(callable, args, "REDUCE"));
      return true;
    }
    case 0x81: {  // NEWOBJ
      PyValuePtr args = pop();
      PyValuePtr cls = pop();
      push(call(cls, args, "NEWOBJ"));
      return true;
    }
    case 0x92: {  // NEWOBJ_EX
      PyValuePtr kwargs = pop();
      PyValuePtr args = pop();
      PyValuePtr cls = pop();
      if (kwargs->kind != K::Dict || !kwargs->dict.empty()) fail("NEWOBJ_EX with keyword arguments");
      push(call(cls, args, "NEWOBJ_EX"));
      return true;
    }
    case 'b': {  // BUILD: OrderedDict._metadata, tensor attributes: the state is dropped
      pop();
      const PyValuePtr& target = top();
      Meta* m = meta(target);
      const bool plain_dict = target->kind == K::Dict;
      const bool tensor = target->kind == K::Tensor && !(m && m->is_storage);
      if (!plain_dict && !tensor) fail(strfmt("BUILD on a %s", kind_name(target->kind)));
      return true;
    }
    case 'Q': push(persistent_load(pop())); return true;  // BINPERSID
    default:
      return false;
  }
}

// The memo.
bool Unpickler::memo_op(uint8_t op) {
  switch (op) {
    case 'q': memo_put(read_le(1)); return true;                  // BINPUT
    case 'r': memo_put(read_le(4)); return true;                  // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); return true;               // MEMOIZE
    case 'p': memo_put(parse_decimal(read_line())); return true;  // PUT
    case 'h': memo_get(read_le(1)); return true;                  // BINGET
    case 'j': memo_get(read_le(4)); return true;                  // LONG_BINGET
    case 'g': memo_get(parse_decimal(read_line())); return true;  // GET
    default:
      return false;
  }
}

PyValuePtr Unpickler::run() {
  while (true) {
    op_pos_ = pos_;
    const uint8_t op = *take(1);
    if (op == '.') return pop();  // STOP
    if (!(stack_op(op) || scalar_op(op) || sequence_op(op) || dict_op(op) || object_op(op) || memo_op(op))) {
      fail(strfmt("unsupported pickle opcode 0x%02x", op));
    }
  }
}

}  // namespace

PyValuePtr unpickle(const uint8_t* data, size_t size, const std::string& name, StorageLoader loader) {
  Unpickler vm(data, size, name, std::move(loader));
  return vm.run();
}

}  // namespace libreyolo::io::detail
