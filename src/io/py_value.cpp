// PyValue: constructors, dict helpers, conversions and repr.
#include "io/py_value.hpp"

#include <cmath>
#include <cstring>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"

namespace libreyolo::io {

using detail::kind_name;

namespace {
PyValuePtr make_value(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
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

namespace detail {

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

}  // namespace detail
}  // namespace libreyolo::io
