// HDF5 handles and attribute helpers shared by checkpoints (src/io), packed
// datasets (src/data) and the parity driver. Header-only: only code that links
// HDF5 includes it. The helpers return a status instead of throwing, because each
// caller words its own errors (checkpoint messages are pinned by tests).
#pragma once

#include <hdf5.h>

#include <cstring>
#include <string>
#include <vector>

namespace rd::h5 {

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Id {
 public:
  Id() = default;
  Id(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    reset();
    id_ = o.id_;
    closer_ = o.closer_;
    o.id_ = -1;
    return *this;
  }
  ~Id() { reset(); }
  void reset() {
    if (id_ >= 0 && closer_) closer_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  hid_t release() {  // the caller closes it (and checks the result)
    const hid_t id = id_;
    id_ = -1;
    return id;
  }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*closer_)(hid_t) = nullptr;
};

// HDF5 prints its error stack on every failed call; we report our own messages (and
// probe for optional objects) with it silenced. Restores the previous handler.
class Quiet {
 public:
  Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Quiet() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5's error printing off for good (not per scope, as Quiet does): a checkpoint
// reader outlives any one scope, and the callers print their own messages.
inline void quiet_for_good() {
  static const bool once = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  (void)once;
}

// Variable-length UTF-8 strings: what h5py reads back as str.
inline Id vlen_string_type() {
  Id t(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

inline bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }
inline bool has_link(hid_t obj, const std::string& name) { return H5Lexists(obj, name.c_str(), H5P_DEFAULT) > 0; }

enum class Status { Ok, Missing, OpenFailed, WrongType, NotSingle, ReadFailed };

// H5Aread writes every element, so an attribute must hold exactly one (an array
// would overflow the caller's scalar; found by fuzzing).
inline bool single_value(hid_t attr) {
  Id space(H5Aget_space(attr), H5Sclose);
  return space.ok() && H5Sget_simple_extent_npoints(space) == 1;
}

// A scalar numeric attribute, converted to `mem_type` (T's native type).
template <class T>
Status read_attr(hid_t obj, const char* name, hid_t mem_type, T& out) {
  if (!has_attr(obj, name)) return Status::Missing;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok() || !single_value(a)) return Status::NotSingle;
  return H5Aread(a, mem_type, &out) < 0 ? Status::ReadFailed : Status::Ok;
}

// A string attribute, fixed or variable length.
inline Status read_attr(hid_t obj, const char* name, std::string& out) {
  if (!has_attr(obj, name)) return Status::Missing;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Id type(H5Aget_type(a), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) return Status::WrongType;
  if (!single_value(a)) return Status::NotSingle;
  if (H5Tis_variable_str(type) > 0) {
    Id mem = vlen_string_type();
    char* p = nullptr;
    if (H5Aread(a, mem, &p) < 0) return Status::ReadFailed;
    out = p ? p : "";
    Id space(H5Aget_space(a), H5Sclose);
    H5Dvlen_reclaim(mem, space, H5P_DEFAULT, &p);
    return Status::Ok;
  }
  const size_t n = H5Tget_size(type);
  std::vector<char> buf(n + 1, '\0');
  Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, n + 1);
  if (H5Aread(a, mem, buf.data()) < 0) return Status::ReadFailed;
  out.assign(buf.data());
  return Status::Ok;
}

// A scalar attribute stored as `file_type` from a value of `mem_type`; false on failure.
inline bool write_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value) {
  Id space(H5Screate(H5S_SCALAR), H5Sclose);
  Id a(H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Awrite(a, mem_type, value) >= 0;
}

// A 1-D dataset of variable-length UTF-8 strings (class names); false on failure.
inline bool write_strings(hid_t parent, const char* name, const std::vector<std::string>& items) {
  Id type = vlen_string_type();
  const hsize_t n = items.size();
  Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Id d(H5Dcreate2(parent, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  std::vector<const char*> ptrs;
  for (const auto& s : items) ptrs.push_back(s.c_str());
  return d.ok() && (n == 0 || H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0);
}

// A dataset of strings, fixed or variable length, in element order.
inline Status read_strings(hid_t parent, const char* name, std::vector<std::string>& out) {
  out.clear();
  if (!has_link(parent, name)) return Status::Missing;
  Id d(H5Dopen2(parent, name, H5P_DEFAULT), H5Dclose);
  if (!d.ok()) return Status::OpenFailed;
  Id type(H5Dget_type(d), H5Tclose);
  Id space(H5Dget_space(d), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (H5Tget_class(type) != H5T_STRING) return Status::WrongType;
  if (n <= 0) return Status::Ok;
  if (H5Tis_variable_str(type) > 0) {
    Id mem = vlen_string_type();
    std::vector<char*> ptrs(static_cast<size_t>(n), nullptr);
    if (H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) return Status::ReadFailed;
    for (char* p : ptrs) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(mem, space, H5P_DEFAULT, ptrs.data());
    return Status::Ok;
  }
  const size_t w = H5Tget_size(type);
  std::vector<char> buf(w * static_cast<size_t>(n) + 1, '\0');
  Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem, w);
  if (H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) return Status::ReadFailed;
  for (hssize_t i = 0; i < n; ++i) {
    const char* p = buf.data() + static_cast<size_t>(i) * w;
    out.emplace_back(p, strnlen(p, w));
  }
  return Status::Ok;
}

}  // namespace rd::h5
