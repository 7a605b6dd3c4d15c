// The safetensors format (Hugging Face's, https://github.com/huggingface/safetensors):
//   8 bytes   little-endian u64 N, the header's length
//   N bytes   a JSON object: "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}
//             per tensor, and an optional "__metadata__": {"key": "string", ...};
//             may end in spaces (writers pad it to 8-byte alignment)
//   the rest  the tensors' bytes, little-endian, C order; offsets relative to here.
// Read directly (no Python, no pickle): every field is checked against the file, so a
// truncated or hostile file is a clear error naming the file and tensor, never a crash.
// Also the sniffing of PyTorch's own formats (the zip one is read by src/io/torch_pth.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rd {
class ResNet;
}

namespace rd::io::safetensors {

// The dtypes we can read: floats become float32; integers only for num_batches_tracked.
enum class DType { F32, F16, BF16, I64, I32 };
const char* dtype_name(DType t);
size_t dtype_size(DType t);
// IEEE half -> float, exact for every value (subnormals, Inf, NaN included).
float half_to_float(uint16_t h);

struct Entry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
  int64_t numel() const;
};

// A validated safetensors file. All checks happen when it is opened; reads cannot go
// out of range afterwards.
class File {
 public:
  // Throws rd::UsageError("safetensors file 'PATH': ...").
  static File open(const std::string& path);
  // The same parser over bytes in memory (fuzzing, tests); `name` appears in errors.
  static File from_bytes(std::string bytes, const std::string& name);

  const std::string& path() const { return path_; }
  const std::vector<Entry>& tensors() const { return tensors_; }  // in data-offset order
  const Entry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Float tensor -> numel() float32 values (F16/BF16 widened exactly).
  void read_f32(const Entry& e, float* out) const;
  // One-element integer (or integral float) tensor, e.g. num_batches_tracked.
  int64_t read_int_scalar(const Entry& e) const;

  [[noreturn]] void bad(const std::string& what) const;
  [[noreturn]] void bad_tensor(const std::string& name, const std::string& what) const;

 private:
  void parse(const std::string& header, uint64_t file_size);
  void read_bytes(uint64_t offset, size_t n, void* out) const;

  std::string path_;
  bool in_memory_ = false;
  std::string bytes_;  // the whole file when in_memory_
  std::vector<Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The bytes of a header for `tensors` (offsets relative to the data, as given) and
// `metadata`: length prefix, JSON, space padding to a multiple of 8 bytes.
std::string make_header(const std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata);

// A JSON string array (for metadata values such as class names) and its reverse, which
// throws rd::UsageError naming `what` on anything but an array of strings.
std::string json_string_array(const std::vector<std::string>& items);
std::vector<std::string> parse_json_string_array(const std::string& text, const std::string& what);

// Writes `model`'s state_dict (torchvision's names and order, state_dict_order) with
// `metadata` to `path`: temp file in the same directory, fsync, rename, fsync of the
// directory, so a failure or crash leaves the old file or the complete new one.
// Throws rd::Error("cannot write 'PATH': ...").
void write_model(const std::string& path, ResNet& model, const std::map<std::string, std::string>& metadata);

enum class Kind { Safetensors, TorchZip, TorchPickle, Other };
// By content (first bytes) or, for safetensors, the .safetensors extension too, so a
// truncated one is still parsed as one and gets a precise message.
Kind sniff(const std::string& path);

// For a PyTorch file in the legacy (pre-1.6, non-zip) format, why resnet_ddp refuses it
// and the command that re-saves it in the zip format, which is read (torch_pth.h); ""
// for anything else.
std::string torch_file_problem(const std::string& path);

}  // namespace rd::io::safetensors
