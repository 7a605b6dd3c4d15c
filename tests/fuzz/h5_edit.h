// Structure-aware mutation of a valid HDF5 file for the packed-dataset and
// checkpoint fuzz targets. Raw-byte fuzzing of an HDF5 file would only fuzz the
// HDF5 library's own parser (not hardened; see docs/checkpoint_format.md for how
// checkpoints contain it). What we own is the parsing *after* HDF5: attribute
// types and values, dataset shapes and types, names and links. So the fuzz input
// is a list of edits, applied through the HDF5 API to a copy of a real file.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace rd::fuzz {

struct H5Names {
  std::vector<std::string> objects;  // "/" and every group / dataset path
  std::vector<std::string> attrs;    // every attribute name seen anywhere
};

inline herr_t collect_object(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<H5Names*>(data)->objects.push_back("/" + std::string(name));
  return 0;
}
inline herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<H5Names*>(data)->attrs.emplace_back(name);
  return 0;
}

inline H5Names list_names(const std::string& path) {
  H5Names n;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return n;
  n.objects.push_back("/");
  H5Lvisit(f, H5_INDEX_NAME, H5_ITER_NATIVE, collect_object, &n);
  for (const auto& o : n.objects) {
    hid_t obj = H5Oopen(f, o.c_str(), H5P_DEFAULT);
    if (obj < 0) continue;
    hsize_t idx = 0;
    H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, collect_attr, &n);
    H5Oclose(obj);
  }
  H5Fclose(f);
  return n;
}

inline std::vector<char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
inline void spit(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A name: usually one the file has, sometimes a fuzzed one.
inline std::string pick(FuzzedDataProvider& fdp, const std::vector<std::string>& names) {
  if (names.empty() || fdp.ConsumeIntegralInRange(0, 7) == 0) return fdp.ConsumeRandomLengthString(24);
  return names[fdp.ConsumeIntegralInRange<size_t>(0, names.size() - 1)];
}

inline hid_t string_type(FuzzedDataProvider& fdp, size_t fixed_len) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (fdp.ConsumeBool()) {
    H5Tset_size(t, H5T_VARIABLE);
  } else {
    H5Tset_size(t, fixed_len ? fixed_len : 1);
    H5Tset_strpad(t, fdp.ConsumeBool() ? H5T_STR_NULLTERM : H5T_STR_NULLPAD);
  }
  if (fdp.ConsumeBool()) H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

// Writes `count` elements of a fuzzed type into a dataset or attribute via `write`.
template <class Write>
void write_values(FuzzedDataProvider& fdp, hid_t space, hssize_t count, Write write, hid_t* type_out) {
  const int kind = fdp.ConsumeIntegralInRange(0, 5);
  const size_t n = count > 0 ? static_cast<size_t>(count) : 0;
  switch (kind) {
    case 0: {  // float32
      std::vector<float> v(n);
      for (auto& x : v) x = fdp.ConsumeFloatingPoint<float>();
      *type_out = H5Tcopy(H5T_IEEE_F32LE);
      write(*type_out, space, v.data());
      break;
    }
    case 1: {  // float64
      std::vector<double> v(n);
      for (auto& x : v) x = fdp.ConsumeFloatingPoint<double>();
      *type_out = H5Tcopy(H5T_IEEE_F64LE);
      write(*type_out, space, v.data());
      break;
    }
    case 2: {  // int64
      std::vector<int64_t> v(n);
      for (auto& x : v) x = fdp.ConsumeIntegral<int64_t>();
      *type_out = H5Tcopy(H5T_STD_I64LE);
      write(*type_out, space, v.data());
      break;
    }
    case 3: {  // int32
      std::vector<int32_t> v(n);
      for (auto& x : v) x = fdp.ConsumeIntegral<int32_t>();
      *type_out = H5Tcopy(H5T_STD_I32LE);
      write(*type_out, space, v.data());
      break;
    }
    case 4: {  // uint8
      std::vector<uint8_t> v(n);
      for (auto& x : v) x = fdp.ConsumeIntegral<uint8_t>();
      *type_out = H5Tcopy(H5T_STD_U8LE);
      write(*type_out, space, v.data());
      break;
    }
    default: {  // strings, variable or fixed length
      std::vector<std::string> s(n);
      size_t longest = 1;
      for (auto& x : s) {
        x = fdp.ConsumeRandomLengthString(40);
        longest = std::max(longest, x.size() + 1);
      }
      *type_out = string_type(fdp, longest);
      if (H5Tis_variable_str(*type_out) > 0) {
        std::vector<const char*> p;
        for (auto& x : s) p.push_back(x.c_str());
        write(*type_out, space, p.data());
      } else {
        const size_t len = H5Tget_size(*type_out);
        std::vector<char> buf(n * len, '\0');
        for (size_t i = 0; i < n; ++i) std::memcpy(&buf[i * len], s[i].data(), std::min(len, s[i].size()));
        write(*type_out, space, buf.data());
      }
    }
  }
}

// A fuzzed dataspace: scalar, or rank 1..5 with small dims (<= 4096 elements).
inline hid_t make_space(FuzzedDataProvider& fdp, hssize_t* count) {
  const int rank = fdp.ConsumeIntegralInRange(0, 5);
  if (rank == 0) {
    *count = 1;
    return H5Screate(fdp.ConsumeIntegralInRange(0, 9) == 0 ? H5S_NULL : H5S_SCALAR);
  }
  hsize_t dims[5];
  hssize_t total = 1;
  for (int i = 0; i < rank; ++i) {
    dims[i] = fdp.ConsumeIntegralInRange<hsize_t>(0, 16);
    if (total * static_cast<hssize_t>(dims[i]) > 4096) dims[i] = 1;
    total *= static_cast<hssize_t>(dims[i]);
  }
  hid_t s = H5Screate_simple(rank, dims, nullptr);
  *count = H5Sget_simple_extent_npoints(s);
  return s;
}

inline void set_attr(FuzzedDataProvider& fdp, hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hssize_t count = 0;
  hid_t space = fdp.ConsumeIntegralInRange(0, 3) == 0 ? make_space(fdp, &count) : H5Screate(H5S_SCALAR);
  if (count == 0) count = H5Sget_simple_extent_npoints(space);
  hid_t type = -1;
  write_values(fdp, space, count,
               [&](hid_t t, hid_t s, const void* data) {
                 hid_t a = H5Acreate2(obj, name.c_str(), t, s, H5P_DEFAULT, H5P_DEFAULT);
                 if (a >= 0) {
                   if (H5Sget_simple_extent_type(s) != H5S_NULL) H5Awrite(a, t, data);
                   H5Aclose(a);
                 }
               },
               &type);
  if (type >= 0) H5Tclose(type);
  H5Sclose(space);
}

inline void make_dataset(FuzzedDataProvider& fdp, hid_t parent, const std::string& name) {
  hssize_t count = 0;
  hid_t space = make_space(fdp, &count);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank > 0 && count > 0 && fdp.ConsumeBool()) {
    std::vector<hsize_t> dims(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    for (int i = 0; i < rank; ++i) chunk[i] = std::max<hsize_t>(1, fdp.ConsumeIntegralInRange<hsize_t>(1, dims[i]));
    H5Pset_chunk(dcpl, rank, chunk.data());
    if (fdp.ConsumeBool()) H5Pset_fletcher32(dcpl);
    if (fdp.ConsumeBool()) H5Pset_deflate(dcpl, 1);
  }
  hid_t type = -1;
  write_values(fdp, space, count,
               [&](hid_t t, hid_t s, const void* data) {
                 hid_t d = H5Dcreate2(parent, name.c_str(), t, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
                 if (d >= 0) {
                   if (H5Sget_simple_extent_type(s) != H5S_NULL && count > 0) H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
                   H5Dclose(d);
                 }
               },
               &type);
  if (type >= 0) H5Tclose(type);
  H5Pclose(dcpl);
  H5Sclose(space);
}

// Applies edits drawn from `fdp` to the HDF5 file at `path` (opened read-write).
inline void apply_edits(FuzzedDataProvider& fdp, const std::string& path, const H5Names& names) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) return;
  const int edits = fdp.ConsumeIntegralInRange(1, 8);
  for (int e = 0; e < edits && fdp.remaining_bytes() > 0; ++e) {
    const std::string obj_path = pick(fdp, names.objects);
    const int op = fdp.ConsumeIntegralInRange(0, 6);
    if (op <= 2) {  // set / retype / delete an attribute
      hid_t obj = H5Oopen(f, obj_path.c_str(), H5P_DEFAULT);
      if (obj < 0) continue;
      const std::string attr = pick(fdp, names.attrs);
      if (op == 0 && H5Aexists(obj, attr.c_str()) > 0) H5Adelete(obj, attr.c_str());
      else if (!attr.empty()) set_attr(fdp, obj, attr);
      H5Oclose(obj);
    } else if (op == 3) {  // remove a group or dataset
      if (obj_path != "/" && H5Lexists(f, obj_path.c_str(), H5P_DEFAULT) > 0) H5Ldelete(f, obj_path.c_str(), H5P_DEFAULT);
    } else if (op == 4 || op == 5) {  // replace a dataset (other shape / type / filters)
      if (obj_path == "/") continue;
      const size_t slash = obj_path.find_last_of('/');
      const std::string parent = slash == 0 ? "/" : obj_path.substr(0, slash);
      const std::string leaf = obj_path.substr(slash + 1);
      if (leaf.empty() || (parent != "/" && H5Lexists(f, parent.c_str(), H5P_DEFAULT) <= 0)) continue;
      hid_t g = H5Oopen(f, parent.c_str(), H5P_DEFAULT);
      if (g < 0) continue;
      if (H5Lexists(g, leaf.c_str(), H5P_DEFAULT) > 0) H5Ldelete(g, leaf.c_str(), H5P_DEFAULT);
      if (op == 4) make_dataset(fdp, g, leaf);
      else H5Gclose(H5Gcreate2(g, leaf.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));  // dataset -> group
      H5Oclose(g);
    } else {  // add a new dataset or soft link under some group
      hid_t g = H5Oopen(f, obj_path.c_str(), H5P_DEFAULT);
      if (g < 0) continue;
      if (H5Iget_type(g) == H5I_GROUP) {
        const std::string leaf = fdp.ConsumeRandomLengthString(24);
        if (!leaf.empty() && leaf.find('/') == std::string::npos && H5Lexists(g, leaf.c_str(), H5P_DEFAULT) <= 0) {
          if (fdp.ConsumeBool()) make_dataset(fdp, g, leaf);
          else H5Lcreate_soft(pick(fdp, names.objects).c_str(), g, leaf.c_str(), H5P_DEFAULT, H5P_DEFAULT);
        }
      }
      H5Oclose(g);
    }
  }
  H5Fclose(f);
}

}  // namespace rd::fuzz
