// PyTorch's torch.save zip format (PyTorch >= 1.6), read without Python:
//   <top>/data.pkl        the pickled object (protocol 2): here a state_dict, an
//                         OrderedDict of name -> tensor
//   <top>/data/<key>      each storage's raw bytes (little-endian), stored uncompressed
//   <top>/byteorder       "little" (absent before PyTorch 2.1: little), <top>/version
// The pickle is run by a restricted unpickler: the opcodes torch.save emits and only the
// globals torch.load(weights_only=True) allows (collections.OrderedDict,
// torch._utils._rebuild_tensor_v2 / _rebuild_tensor / _rebuild_parameter, the
// torch.*Storage types); every other global is refused by name, nothing is ever called.
// Every size, stride, offset and storage is checked against the archive, so a hostile or
// truncated file is an error naming the file, never a read out of bounds.
// The legacy format (torch.save before 1.6, or _use_new_zipfile_serialization=False) is
// refused with the command that re-saves it (legacy_format_problem).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace rd::io::torch_pth {

// Element types of the storages read (torch.FloatStorage ... torch.BoolStorage).
enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, Bool };
const char* dtype_name(DType t);  // "float32", ...
size_t dtype_size(DType t);
bool is_float(DType t);

struct Tensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape, stride;  // stride in elements; any non-overlapping view
  int64_t offset = 0;                  // storage offset, elements
  uint64_t storage_begin = 0;          // the storage's first byte in the archive
  int64_t numel() const;
};

class Archive {
 public:
  // Which state_dict of a training checkpoint is read. Model: the object itself, or its
  // "state_dict" / "model" / "model_state_dict" entry. Ema: torchvision's "model_ema"
  // (an AveragedModel's: "module." names, n_averaged dropped) or timm's "state_dict_ema";
  // a file with neither is refused.
  enum class Select { Model, Ema };
  // Reads the whole file, checks torch.hub's name checksum (name_hash_problem), parses.
  // Throws rd::UsageError("PyTorch file 'PATH': ...").
  static Archive open(const std::string& path, Select select = Select::Model);
  // The same parser over bytes in memory (fuzzing, tests); `name` appears in errors.
  static Archive from_bytes(std::string bytes, const std::string& name, Select select = Select::Model);

  const std::string& path() const { return path_; }
  // The top-level key the tensors were read from ("model_ema", ...); "" when the file
  // is the state_dict itself.
  const std::string& key() const { return key_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // state_dict order
  const Tensor* find(const std::string& name) const;

  // Floating-point tensor -> numel() float32 values in C order (float16/bfloat16 widened
  // exactly, float64 rounded to nearest, as HDF5 converts).
  void read_f32(const Tensor& t, float* out) const;
  // One-element integer (or integral float) tensor, e.g. num_batches_tracked.
  int64_t read_int_scalar(const Tensor& t) const;

  [[noreturn]] void bad(const std::string& what) const;

 private:
  void parse(Select select);
  double element(const Tensor& t, uint64_t index) const;

  std::string path_;
  std::string key_;
  std::string bytes_;  // the whole file
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> tensors_ position
};

// Why a legacy-format file (a pickle from its first byte) is refused, with the command
// that re-saves it in the zip format.
std::string legacy_format_problem(const std::string& path);

// torch.hub's check_hash rule: a file named like "resnet50-11ad3fa6.pth" (the first
// "-<hex digits>." of the name) must have a SHA-256 starting with those digits. Applied
// when there are at least 8 digits (torchvision's names), so "model-1.pth" is not taken
// for a hash. Why `bytes` (the file named `path`) fails it, or "" when it passes.
std::string name_hash_problem(const std::string& path, const std::string& bytes);

}  // namespace rd::io::torch_pth
