#include "resnet_ddp/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>

#include "resnet_ddp/errors.h"
#include "io/torch_pth.h"
#include "resnet_ddp/io/json.h"

namespace fs = std::filesystem;

namespace rd::io::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swapping here");

namespace {

// The reference implementation refuses headers above 100 MB; a ResNet-50's is ~40 kB.
constexpr uint64_t kMaxHeader = 100'000'000;
constexpr size_t kMaxRank = 8;

// A non-negative JSON integer that fits in u64 (no sign, fraction or exponent).
bool to_u64(const Json& j, uint64_t& v) {
  if (j.type != Json::Number || j.text.empty() || j.text[0] == '-') return false;
  const char* b = j.text.data();
  const char* e = b + j.text.size();
  auto [p, ec] = std::from_chars(b, e, v);
  return ec == std::errc() && p == e;
}

bool parse_dtype(const std::string& s, DType& t) {
  static const std::pair<const char*, DType> names[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"I64", DType::I64}, {"I32", DType::I32}};
  for (const auto& [n, d] : names)
    if (s == n) return t = d, true;
  return false;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

// IEEE half -> float, exact for every value (subnormals, Inf, NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise into float's range
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F16:
    case DType::BF16: return 2;
    case DType::F32:
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

int64_t Entry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // bounded when the file was parsed
  return n;
}

void File::bad_tensor(const std::string& name, const std::string& what) const {
  bad("tensor '" + name + "': " + what);
}

void File::bad(const std::string& what) const { throw UsageError("safetensors file '" + path_ + "': " + what); }

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) f.bad("no such file");
  if (fs::is_directory(path, ec)) f.bad("is a directory");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) f.bad("cannot get its size: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) f.bad(std::string("cannot open it: ") + std::strerror(errno));
  if (size < 8) f.bad("only " + std::to_string(size) + " bytes, shorter than the 8-byte header length (truncated?)");
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) f.bad("cannot read the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > size - 8)
    f.bad("header length " + std::to_string(n) + " exceeds the file's remaining " + std::to_string(size - 8) +
          " bytes (truncated, or not a safetensors file)");
  if (n > kMaxHeader) f.bad("header length " + std::to_string(n) + " is over the 100 MB limit");
  std::string header(static_cast<size_t>(n), '\0');
  if (n && !in.read(header.data(), static_cast<std::streamsize>(n))) f.bad("cannot read the header (truncated?)");
  f.parse(header, size);
  return f;
}

File File::from_bytes(std::string bytes, const std::string& name) {
  File f;
  f.path_ = name;
  f.in_memory_ = true;
  f.bytes_ = std::move(bytes);
  const uint64_t size = f.bytes_.size();
  if (size < 8) f.bad("only " + std::to_string(size) + " bytes, shorter than the 8-byte header length (truncated?)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(f.bytes_[static_cast<size_t>(i)]);
  if (n > size - 8)
    f.bad("header length " + std::to_string(n) + " exceeds the file's remaining " + std::to_string(size - 8) +
          " bytes (truncated, or not a safetensors file)");
  if (n > kMaxHeader) f.bad("header length " + std::to_string(n) + " is over the 100 MB limit");
  f.parse(f.bytes_.substr(8, static_cast<size_t>(n)), size);
  return f;
}

void File::parse(const std::string& header, uint64_t file_size) {
  if (header.empty() || header[0] != '{') bad("the header does not start with '{' (not a safetensors file?)");
  Json root;
  std::string error;
  if (!parse_json(header, root, error)) bad("the header is not valid JSON: " + error);
  if (root.type != Json::Object) bad("the header is not a JSON object");
  const uint64_t data_start = 8 + header.size();
  const uint64_t data_len = file_size - data_start;
  for (size_t member = 0; member < root.keys.size(); ++member) {
    const std::string& name = root.keys[member];
    const Json& v = root.values[member];
    if (name == "__metadata__") {
      if (v.type == Json::Null) continue;  // the reference reader takes null as "none"
      if (v.type != Json::Object) bad("__metadata__ is not an object of strings");
      for (size_t i = 0; i < v.keys.size(); ++i) {
        const std::string& k = v.keys[i];
        const Json& mv = v.values[i];
        if (mv.type != Json::String) bad("__metadata__ value for \"" + k + "\" is not a string");
        metadata_[k] = mv.text;
      }
      continue;
    }
    if (name.empty()) bad("a tensor has an empty name");
    if (v.type != Json::Object) bad_tensor(name, "its entry is not an object");
    Entry e;
    e.name = name;
    const Json* dtype = v.member("dtype");
    const Json* shape = v.member("shape");
    const Json* offsets = v.member("data_offsets");
    if (!dtype || dtype->type != Json::String) bad_tensor(name, "missing or non-string \"dtype\"");
    if (!parse_dtype(dtype->text, e.dtype))
      bad_tensor(name, "dtype " + dtype->text + " is not supported (F32, F16 or BF16; I64/I32 for num_batches_tracked)");
    if (!shape || shape->type != Json::Array) bad_tensor(name, "missing or non-array \"shape\"");
    if (shape->items.size() > kMaxRank) bad_tensor(name, "rank " + std::to_string(shape->items.size()) + " is too large");
    // numel * element size is bounded by the data length, so nothing below overflows.
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : shape->items) {
      uint64_t x = 0;
      if (!to_u64(d, x) || x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad_tensor(name, "\"shape\" holds something other than a non-negative integer");
      e.shape.push_back(static_cast<int64_t>(x));
      if (x != 0 && numel > std::numeric_limits<uint64_t>::max() / x) overflow = true;
      else numel *= x;
    }
    if (!offsets || offsets->type != Json::Array || offsets->items.size() != 2)
      bad_tensor(name, "\"data_offsets\" is not a [begin, end] pair");
    uint64_t b = 0, en = 0;
    if (!to_u64(offsets->items[0], b) || !to_u64(offsets->items[1], en))
      bad_tensor(name, "\"data_offsets\" holds something other than non-negative integers");
    if (b > en) bad_tensor(name, "data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] run backwards");
    if (en > data_len)
      bad_tensor(name, "data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + "] end past the data (" +
           std::to_string(data_len) + " bytes after the header; truncated?)");
    const uint64_t esize = dtype_size(e.dtype);
    if (overflow || numel > data_len / esize || numel * esize != en - b)
      bad_tensor(name, "shape " + shape_str(e.shape) + " of " + dtype_name(e.dtype) + " does not fill its " +
           std::to_string(en - b) + " bytes");
    e.begin = data_start + b;
    e.end = data_start + en;
    tensors_.push_back(std::move(e));
  }
  // The data must be covered exactly once: overlapping tensors would alias, holes or
  // trailing bytes could hide another file's content (the reference reader's rule too).
  std::sort(tensors_.begin(), tensors_.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = data_start;
  for (const Entry& e : tensors_) {
    if (e.begin < at)
      bad("tensors '" + e.name + "' and another overlap (byte " + std::to_string(e.begin - data_start) + ")");
    if (e.begin > at)
      bad("bytes " + std::to_string(at - data_start) + ".." + std::to_string(e.begin - data_start) +
          " of the data belong to no tensor (before '" + e.name + "')");
    at = e.end;
  }
  if (at != file_size)
    bad(std::to_string(file_size - at) + " bytes after the last tensor belong to no tensor");
}

const Entry* File::find(const std::string& name) const {
  for (const Entry& e : tensors_)
    if (e.name == name) return &e;
  return nullptr;
}

void File::read_bytes(uint64_t offset, size_t n, void* out) const {
  if (n == 0) return;
  if (in_memory_) {
    std::memcpy(out, bytes_.data() + offset, n);
    return;
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in) bad(std::string("cannot open it: ") + std::strerror(errno));
  in.seekg(static_cast<std::streamoff>(offset));
  // Checked at open; a file that shrank since is still refused, not read past its end.
  if (!in.read(static_cast<char*>(out), static_cast<std::streamsize>(n)))
    bad("cannot read " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
        " (file changed or truncated since it was opened?)");
}

void File::read_f32(const Entry& e, float* out) const {
  const size_t n = static_cast<size_t>(e.numel());
  switch (e.dtype) {
    case DType::F32: read_bytes(e.begin, n * 4, out); return;
    case DType::F16:
    case DType::BF16: {
      std::vector<uint16_t> raw(n);
      read_bytes(e.begin, n * 2, raw.data());
      for (size_t i = 0; i < n; ++i) {
        if (e.dtype == DType::F16) {
          out[i] = half_to_float(raw[i]);
        } else {  // bfloat16 is float32's upper half
          const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
          std::memcpy(&out[i], &bits, sizeof(float));
        }
      }
      return;
    }
    default: bad("tensor '" + e.name + "' has dtype " + dtype_name(e.dtype) + ", expected F32, F16 or BF16");
  }
}

int64_t File::read_int_scalar(const Entry& e) const {
  if (e.numel() != 1) bad("tensor '" + e.name + "' should hold one value, has shape " + shape_str(e.shape));
  switch (e.dtype) {
    case DType::I64: {
      int64_t v = 0;
      read_bytes(e.begin, 8, &v);
      return v;
    }
    case DType::I32: {
      int32_t v = 0;
      read_bytes(e.begin, 4, &v);
      return v;
    }
    default: {
      float f = 0;
      read_f32(e, &f);
      if (!(f >= 0 && f < 9.0e15f) || f != static_cast<float>(static_cast<int64_t>(f)))
        bad("tensor '" + e.name + "' should hold a non-negative integer");
      return static_cast<int64_t>(f);
    }
  }
}

std::string make_header(const std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) json += ",";
      json += json_string(k) + ":" + json_string(v);
      first = false;
    }
    json += "}";
  }
  for (const Entry& e : tensors) {
    if (json.size() > 1) json += ",";
    json += json_string(e.name) + ":{\"dtype\":\"" + dtype_name(e.dtype) + "\",\"shape\":[";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) json += ",";
      json += std::to_string(e.shape[i]);
    }
    json += "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  json += "}";
  // Spaces up to a multiple of 8 bytes keep every tensor aligned for memory-mapping readers.
  while ((8 + json.size()) % 8 != 0) json += ' ';
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + json;
}

std::string json_string_array(const std::vector<std::string>& items) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) s += ", ";
    s += json_string(items[i]);
  }
  return s + "]";
}

std::vector<std::string> parse_json_string_array(const std::string& text, const std::string& what) {
  Json j;
  std::string error;
  if (!parse_json(text, j, error)) throw UsageError(what + " is not valid JSON: " + error);
  if (j.type != Json::Array) throw UsageError(what + " is not a JSON array of strings");
  std::vector<std::string> out;
  for (const Json& item : j.items) {
    if (item.type != Json::String) throw UsageError(what + " is not a JSON array of strings");
    out.push_back(item.text);
  }
  return out;
}

Kind sniff(const std::string& path) {
  unsigned char b[9] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(b), sizeof b);
  const std::streamsize got = in ? static_cast<std::streamsize>(sizeof b) : in.gcount();
  if (got >= 4 && b[0] == 'P' && b[1] == 'K' && b[2] == 3 && b[3] == 4) return Kind::TorchZip;
  // torch.save before PyTorch 1.6 (and pickle.dump): pickle protocol 2..5 opcode.
  if (got >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return Kind::TorchPickle;
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".safetensors") return Kind::Safetensors;
  // A small little-endian length followed by the header's '{'.
  if (got == 9 && b[8] == '{' && b[5] == 0 && b[6] == 0 && b[7] == 0) return Kind::Safetensors;
  return Kind::Other;
}

std::string torch_file_problem(const std::string& path) {
  return sniff(path) == Kind::TorchPickle ? torch_pth::legacy_format_problem(path) : "";
}

}  // namespace rd::io::safetensors
