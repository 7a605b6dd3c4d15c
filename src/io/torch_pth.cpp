#include "io/torch_pth.h"

#include <zlib.h>

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>

#include "io/sha256.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/safetensors.h"

namespace fs = std::filesystem;

namespace rd::io::torch_pth {

static_assert(std::endian::native == std::endian::little,
              "torch.save's storages are read as little-endian; a big-endian host would need byte swapping here");

namespace {

constexpr size_t kMaxRank = 8;
// A ResNet-152 state_dict's pickle makes ~20,000 objects; each costs ~250 bytes here.
constexpr size_t kMaxValues = 2'000'000;

// ---- zip (stored entries only, as torch.save writes them) ----------------------------

struct ZipEntry {
  uint64_t begin = 0, size = 0;  // the entry's data in the archive
  uint32_t crc = 0;
  bool checked = false;
};

uint64_t le(const std::string& b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<uint64_t>(i)]);
  return v;
}

// The central directory's entries by name. `fail` throws.
template <class Fail>
std::map<std::string, ZipEntry> read_zip(const std::string& b, Fail fail) {
  const uint64_t n = b.size();
  if (n < 22) fail("only " + std::to_string(n) + " bytes: no zip end record (truncated?)");
  uint64_t eocd = n;  // the end record: signature, then a comment of at most 64 kB
  for (uint64_t at = n - 22 + 1; at-- > 0 && n - at <= 22 + 65535;)
    if (le(b, at, 4) == 0x06054b50 && at + 22 + le(b, at + 20, 2) == n) {
      eocd = at;
      break;
    }
  if (eocd == n) fail("no zip end record at its end (truncated, or not a torch.save file)");
  const uint64_t count = le(b, eocd + 10, 2), cd_size = le(b, eocd + 12, 4), cd_at = le(b, eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_at == 0xFFFFFFFF)
    fail("is a ZIP64 archive (over 4 GB or 65535 entries), which this reader does not read");
  if (cd_at > eocd || cd_size > eocd - cd_at) fail("its zip directory lies outside the file (truncated?)");
  std::map<std::string, ZipEntry> out;
  uint64_t at = cd_at;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t rec = at;
    if (at + 46 > cd_at + cd_size || le(b, at, 4) != 0x02014b50) fail("its zip directory is damaged");
    const uint64_t flags = le(b, at + 8, 2), method = le(b, at + 10, 2);
    const uint64_t csize = le(b, at + 20, 4), usize = le(b, at + 24, 4);
    const uint64_t name_len = le(b, at + 28, 2), extra = le(b, at + 30, 2), comment = le(b, at + 32, 2);
    const uint64_t local = le(b, at + 42, 4);
    if (at + 46 + name_len + extra + comment > cd_at + cd_size) fail("its zip directory is damaged");
    const std::string name = b.substr(at + 46, name_len);
    at += 46 + name_len + extra + comment;
    if (flags & 1) fail("zip entry '" + name + "' is encrypted");
    if (method != 0)
      fail("zip entry '" + name + "' is compressed (method " + std::to_string(method) +
           (method == 8 ? ", deflate" : "") + "); torch.save stores entries uncompressed, so the archive was "
           "rewritten by another tool: re-save it with torch.save(torch.load(FILE, weights_only=True), NEW)");
    if (csize != usize) fail("zip entry '" + name + "' is stored with differing sizes");
    if (local > cd_at || local + 30 > cd_at || le(b, local, 4) != 0x04034b50)
      fail("zip entry '" + name + "' has no local header where the directory says (damaged?)");
    const uint64_t begin = local + 30 + le(b, local + 26, 2) + le(b, local + 28, 2);
    if (begin > cd_at || usize > cd_at - begin)
      fail("zip entry '" + name + "' runs past the data (truncated?)");
    if (!out.emplace(name, ZipEntry{begin, usize, static_cast<uint32_t>(le(b, rec + 16, 4)), false}).second)
      fail("zip entry '" + name + "' appears twice");
  }
  return out;
}

// ---- the restricted unpickler ----------------------------------------------------------

struct Value {
  enum Kind { None, Bool, Int, Float, Str, Tuple, List, Dict, Global, Storage, TensorRef };
  Kind kind = None;
  int64_t i = 0;                  // Bool, Int
  double f = 0;                   // Float
  std::string s;                  // Str; Global: "module.name"; Storage: its key
  std::vector<Value*> items;      // Tuple, List; Dict: key, value, key, value ...
  DType dtype = DType::F32;       // Storage
  const ZipEntry* entry = nullptr;  // Storage
  uint64_t numel = 0;             // Storage
  Tensor tensor;                  // TensorRef (name unset); storage_begin from its Storage
  uint64_t storage_numel = 0;     // TensorRef
};

const char* kind_name(Value::Kind k) {
  static const char* names[] = {"None", "bool", "int", "float", "str", "tuple", "list", "dict", "global", "storage",
                                "tensor"};
  return names[k];
}

// The storage types torch.save writes for the dtypes we read.
bool storage_dtype(const std::string& global, DType& t) {
  static const std::pair<const char*, DType> types[] = {
      {"torch.FloatStorage", DType::F32}, {"torch.HalfStorage", DType::F16},  {"torch.BFloat16Storage", DType::BF16},
      {"torch.DoubleStorage", DType::F64}, {"torch.LongStorage", DType::I64}, {"torch.IntStorage", DType::I32},
      {"torch.ShortStorage", DType::I16}, {"torch.CharStorage", DType::I8},   {"torch.ByteStorage", DType::U8},
      {"torch.BoolStorage", DType::Bool}};
  for (const auto& [n, d] : types)
    if (global == n) return t = d, true;
  return false;
}

// Globals torch.load(weights_only=True) allows that we do not build (sparse, quantized,
// meta tensors, other storage types, dtypes, torch.Size...): refused as unsupported, not
// as unsafe.
bool torch_allows(const std::string& g) {
  static const char* names[] = {"torch.nn.parameter.Parameter", "torch.Size", "torch.Tensor",
                                "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_sparse_csr_tensor",
                                "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_qtensor",
                                "torch._utils._rebuild_wrapper_subclass", "torch.serialization._get_layout",
                                "torch._tensor._rebuild_from_type_v2", "torch.device"};
  for (const char* n : names)
    if (g == n) return true;
  static const char* dtypes[] = {"float32", "float", "float16", "half", "bfloat16", "float64", "double",
                                 "int64", "long", "int32", "int", "int16", "short", "int8", "uint8", "bool",
                                 "complex64", "cfloat", "complex128", "cdouble", "qint8", "quint8", "qint32"};
  for (const char* d : dtypes)
    if (g == std::string("torch.") + d) return true;
  if (g.rfind("torch.", 0) != 0 || g.find('.', 6) != std::string::npos) return false;
  const std::string leaf = g.substr(6);  // torch.<X>Storage, torch.<X>Tensor
  auto ends = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return leaf.size() > n && leaf.compare(leaf.size() - n, n, suffix) == 0 && std::isupper(static_cast<unsigned char>(leaf[0]));
  };
  return ends("Storage") || ends("Tensor");
}

// A training checkpoint's `args` (torchvision's and timm's train.py save their
// argparse.Namespace): built as an inert attribute dict, never called; its values are
// plain literals or it is refused like any other pickle.
constexpr const char* kNamespace = "argparse.Namespace";

bool reads_global(const std::string& g) {
  DType t;
  return g == "collections.OrderedDict" || g == kNamespace || g == "torch._utils._rebuild_tensor_v2" ||
         g == "torch._utils._rebuild_tensor" || g == "torch._utils._rebuild_parameter" ||
         g == "torch._utils._rebuild_parameter_with_state" || storage_dtype(g, t);
}

class Unpickler {
 public:
  Unpickler(const std::string& pkl, std::map<std::string, ZipEntry>& entries, const std::string& data_dir,
            const Archive& archive)
      : p_(pkl), entries_(entries), data_dir_(data_dir), ar_(archive) {}
  Value* run();

 private:
  const std::string& p_;
  std::map<std::string, ZipEntry>& entries_;
  std::string data_dir_;
  const Archive& ar_;
  uint64_t at_ = 0;
  std::vector<std::unique_ptr<Value>> arena_;  // owns every value: cycles through the memo cannot leak
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;

  [[noreturn]] void bad(const std::string& what) const {
    ar_.bad("data.pkl byte " + std::to_string(at_) + ": " + what);
  }
  Value* make(Value::Kind k) {
    if (arena_.size() >= kMaxValues)  // bounds memory: a hostile pickle of one-byte opcodes
      bad("over " + std::to_string(kMaxValues) + " pickled objects; a state_dict has a few dozen per tensor");
    arena_.push_back(std::make_unique<Value>());
    arena_.back()->kind = k;
    return arena_.back().get();
  }
  uint64_t take(int n) {
    if (p_.size() - at_ < static_cast<uint64_t>(n)) bad("the pickle ends early (truncated?)");
    const uint64_t v = le(p_, at_, n);
    at_ += static_cast<uint64_t>(n);
    return v;
  }
  std::string take_bytes(uint64_t n) {
    if (p_.size() - at_ < n) bad("the pickle ends early (truncated?)");
    std::string s = p_.substr(at_, n);
    at_ += n;
    return s;
  }
  std::string take_line() {
    const size_t nl = p_.find('\n', at_);
    if (nl == std::string::npos) bad("the pickle ends early (truncated?)");
    std::string s = p_.substr(at_, nl - at_);
    at_ = nl + 1;
    return s;
  }
  Value* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) bad("pops an empty stack");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.empty()) bad("reads an empty stack");
    return stack_.back();
  }
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) bad("has no MARK to pop to");
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Value* tuple(std::vector<Value*> items) {
    Value* t = make(Value::Tuple);
    t->items = std::move(items);
    return t;
  }
  Value* global(const std::string& module, const std::string& name);
  Value* reduce(Value* func, Value* args);
  Value* new_object(Value* cls, Value* args);
  Value* persistent(Value* pid);
  Value* rebuild_tensor(const std::vector<Value*>& a, const std::string& how);
  void set_items(Value* dict, const std::vector<Value*>& kv);
  bool push_literal(unsigned char op);
  bool step(unsigned char op);
};

Value* Unpickler::global(const std::string& module, const std::string& name) {
  const std::string g = module + "." + name;
  if (!reads_global(g)) {
    if (torch_allows(g))
      bad("names '" + g + "', which torch.load(weights_only=True) allows but resnet_ddp does not read (it reads "
          "a state_dict of dense tensors)");
    ar_.bad("refused: its pickle names the global '" + g + "', which torch.load(weights_only=True) refuses too: "
            "a state_dict needs only collections.OrderedDict, torch._utils._rebuild_tensor_v2/_rebuild_parameter "
            "and torch.*Storage, and unpickling anything else could run code. Nothing was executed");
  }
  Value* v = make(Value::Global);
  v->s = g;
  return v;
}

// Appends: a repeated key is resolved when the state_dict is read (the last one wins, as
// in Python), so a hostile pickle of many keys stays linear here.
void Unpickler::set_items(Value* dict, const std::vector<Value*>& kv) {
  if (dict->kind != Value::Dict) bad("SETITEM(S) on a " + std::string(kind_name(dict->kind)));
  if (kv.size() % 2) bad("SETITEMS with an odd number of items");
  dict->items.insert(dict->items.end(), kv.begin(), kv.end());
}

// ('storage', torch.<T>Storage, key, location, numel): the storage data/<key>.
Value* Unpickler::persistent(Value* pid) {
  const auto& a = pid->items;
  if (pid->kind != Value::Tuple || a.size() != 5 || a[0]->kind != Value::Str || a[0]->s != "storage" ||
      a[1]->kind != Value::Global || a[2]->kind != Value::Str || a[4]->kind != Value::Int)
    bad("a persistent id is not ('storage', type, key, location, numel)");
  Value* st = make(Value::Storage);
  if (!storage_dtype(a[1]->s, st->dtype)) bad("storage type '" + a[1]->s + "' is not a storage type read here");
  st->s = a[2]->s;
  const auto it = entries_.find(data_dir_ + st->s);
  if (it == entries_.end()) bad("storage '" + st->s + "' has no entry data/" + st->s + " in the archive (truncated?)");
  st->entry = &it->second;
  if (a[4]->i < 0) bad("storage '" + st->s + "' has a negative size");
  st->numel = static_cast<uint64_t>(a[4]->i);
  const uint64_t esize = dtype_size(st->dtype);
  if (st->numel > it->second.size / esize)
    bad("storage '" + st->s + "' should hold " + std::to_string(st->numel) + " " + dtype_name(st->dtype) +
        " values, its entry has " + std::to_string(it->second.size) + " bytes (truncated?)");
  return st;
}

// _rebuild_tensor(_v2)(storage, storage_offset, size, stride, ...): checked here so that
// every element a reader can address lies inside its storage.
Value* Unpickler::rebuild_tensor(const std::vector<Value*>& a, const std::string& how) {
  if (a[0]->kind != Value::Storage || a[1]->kind != Value::Int || a[2]->kind != Value::Tuple ||
      a[3]->kind != Value::Tuple)
    bad(how + " is not called with (storage, offset, size, stride)");
  const Value& st = *a[0];
  Value* t = make(Value::TensorRef);
  Tensor& ten = t->tensor;
  ten.dtype = st.dtype;
  ten.storage_begin = st.entry->begin;
  t->storage_numel = st.numel;
  if (a[2]->items.size() != a[3]->items.size() || a[2]->items.size() > kMaxRank)
    bad(how + ": size and stride differ in rank, or rank is over " + std::to_string(kMaxRank));
  if (a[1]->i < 0) bad(how + ": negative storage offset");
  ten.offset = a[1]->i;
  uint64_t numel = 1, last = static_cast<uint64_t>(ten.offset);  // last: the highest element addressed
  for (size_t d = 0; d < a[2]->items.size(); ++d) {
    const Value* size = a[2]->items[d];
    const Value* stride = a[3]->items[d];
    if (size->kind != Value::Int || stride->kind != Value::Int || size->i < 0 || stride->i < 0)
      bad(how + ": a size or stride is not a non-negative integer");
    ten.shape.push_back(size->i);
    ten.stride.push_back(stride->i);
    if (size->i == 0) numel = 0;
    else if (numel && static_cast<uint64_t>(size->i) > st.numel / numel + 1) numel = st.numel + 1;  // too many
    else numel *= static_cast<uint64_t>(size->i);
    if (size->i > 0 && stride->i > 0) {
      if (static_cast<uint64_t>(size->i - 1) > st.numel / static_cast<uint64_t>(stride->i)) last = st.numel;
      else last += static_cast<uint64_t>(size->i - 1) * static_cast<uint64_t>(stride->i);
      if (last > st.numel) last = st.numel;
    }
  }
  if (numel > st.numel)  // also bounds what a reader allocates by the file's size
    bad(how + ": " + std::to_string(ten.shape.size()) + "-d view has more elements than its storage '" + st.s +
        "' (" + std::to_string(st.numel) + "); expanded views are not read");
  if (numel > 0 && last >= st.numel)
    bad(how + ": the view (offset " + std::to_string(ten.offset) + ", sizes and strides) reaches past its storage '" +
        st.s + "' of " + std::to_string(st.numel) + " elements");
  return t;
}

// NEWOBJ: cls.__new__(cls, *args), for argparse.Namespace only (a training checkpoint's
// "args"): an inert dict, its attributes arriving by BUILD; nothing is called.
Value* Unpickler::new_object(Value* cls, Value* args) {
  if (cls->kind != Value::Global || cls->s != kNamespace || args->kind != Value::Tuple || !args->items.empty())
    bad("NEWOBJ of a " + std::string(cls->kind == Value::Global ? cls->s : kind_name(cls->kind)) +
        ", which a checkpoint's state_dict never needs");
  return make(Value::Dict);
}

Value* Unpickler::reduce(Value* func, Value* args) {
  if (func->kind != Value::Global) bad("REDUCE calls a " + std::string(kind_name(func->kind)) + ", not a global");
  if (args->kind != Value::Tuple) bad("REDUCE's arguments are not a tuple");
  const std::string& g = func->s;
  const std::vector<Value*>& a = args->items;
  if (g == "collections.OrderedDict") {
    if (!a.empty()) bad("collections.OrderedDict is called with arguments");
    return make(Value::Dict);
  }
  if (g == "torch._utils._rebuild_tensor_v2" && (a.size() == 6 || a.size() == 7)) return rebuild_tensor(a, g);
  if (g == "torch._utils._rebuild_tensor" && a.size() == 4) return rebuild_tensor(a, g);
  if ((g == "torch._utils._rebuild_parameter" && a.size() == 3) ||
      (g == "torch._utils._rebuild_parameter_with_state" && a.size() == 4)) {
    if (a[0]->kind != Value::TensorRef) bad(g + " is not given a tensor");
    return a[0];
  }
  bad("calls '" + g + "' with " + std::to_string(a.size()) + " arguments, which a state_dict never does");
}

// A literal opcode (None, bool, int, float, string) pushes its value; false for others.
bool Unpickler::push_literal(unsigned char op) {
  switch (op) {
    case 'N': stack_.push_back(make(Value::None)); return true;  // NONE
    case 0x88: case 0x89: {                                      // NEWTRUE, NEWFALSE
      Value* v = make(Value::Bool);
      v->i = op == 0x88;
      stack_.push_back(v);
      return true;
    }
    case 'J': case 'K': case 'M': case 0x8a: {  // BININT, BININT1, BININT2, LONG1
      Value* v = make(Value::Int);
      if (op == 'J') v->i = static_cast<int32_t>(take(4));
      else if (op == 'K') v->i = static_cast<int64_t>(take(1));
      else if (op == 'M') v->i = static_cast<int64_t>(take(2));
      else {
        const uint64_t n = take(1);
        if (n > 8) bad("an integer of " + std::to_string(n) + " bytes is too large");
        const uint64_t raw = n ? take(static_cast<int>(n)) : 0;
        v->i = n == 0 ? 0 : n == 8 ? static_cast<int64_t>(raw)
                                    : static_cast<int64_t>(raw << (64 - 8 * n)) >> (64 - 8 * n);  // sign-extend
      }
      stack_.push_back(v);
      return true;
    }
    case 'G': {  // BINFLOAT, big-endian
      uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | take(1);
      Value* v = make(Value::Float);
      std::memcpy(&v->f, &bits, 8);
      stack_.push_back(v);
      return true;
    }
    case 'X': case 0x8c: case 'U': case 'T': {  // BINUNICODE, SHORT_BINUNICODE, SHORT_BINSTRING, BINSTRING
      Value* v = make(Value::Str);
      v->s = take_bytes(take(op == 'X' || op == 'T' ? 4 : 1));
      stack_.push_back(v);
      return true;
    }
    default: return false;
  }
}

// One opcode; false at STOP. The opcodes torch.save's pickler (protocol 2) emits, plus
// protocol 4's framing, memoize and short strings; anything else is refused.
bool Unpickler::step(unsigned char op) {
  if (push_literal(op)) return true;
  switch (op) {
    case 0x80: (void)take(1); return true;                       // PROTO
    case 0x95: (void)take(8); return true;                       // FRAME
    case '.': return false;                                      // STOP
    case '(': marks_.push_back(stack_.size()); return true;      // MARK
    case ')': stack_.push_back(tuple({})); return true;           // EMPTY_TUPLE
    case ']': stack_.push_back(make(Value::List)); return true;   // EMPTY_LIST
    case '}': stack_.push_back(make(Value::Dict)); return true;   // EMPTY_DICT
    case 't': stack_.push_back(tuple(pop_mark())); return true;   // TUPLE
    case 0x85: case 0x86: case 0x87: {                             // TUPLE1..3
      std::vector<Value*> items(static_cast<size_t>(op - 0x84));
      for (size_t i = items.size(); i-- > 0;) items[i] = pop();
      stack_.push_back(tuple(std::move(items)));
      return true;
    }
    case 'q': memo_[take(1)] = top(); return true;                // BINPUT
    case 'r': memo_[take(4)] = top(); return true;                // LONG_BINPUT
    case 0x94: memo_[memo_.size()] = top(); return true;          // MEMOIZE
    case 'h': case 'j': {                                          // BINGET, LONG_BINGET
      const auto it = memo_.find(take(op == 'h' ? 1 : 4));
      if (it == memo_.end()) bad("BINGET of a memo slot never set");
      stack_.push_back(it->second);
      return true;
    }
    case 'c': {  // GLOBAL
      const std::string module = take_line();
      stack_.push_back(global(module, take_line()));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      Value* name = pop();
      Value* module = pop();
      if (name->kind != Value::Str || module->kind != Value::Str) bad("STACK_GLOBAL of non-strings");
      stack_.push_back(global(module->s, name->s));
      return true;
    }
    case 'R': {  // REDUCE
      Value* args = pop();
      Value* func = pop();
      stack_.push_back(reduce(func, args));
      return true;
    }
    case 'Q': stack_.push_back(persistent(pop())); return true;  // BINPERSID
    case 0x81: {  // NEWOBJ
      Value* args = pop();
      stack_.push_back(new_object(pop(), args));
      return true;
    }
    case 'b': {  // BUILD: an OrderedDict's attributes (state_dict._metadata): not needed
      Value* state = pop();
      if (top()->kind != Value::Dict || (state->kind != Value::Dict && state->kind != Value::None))
        bad("BUILD on a " + std::string(kind_name(top()->kind)) + ", which torch.load(weights_only=True) refuses");
      return true;
    }
    case 's': {  // SETITEM
      Value* v = pop();
      Value* k = pop();
      set_items(top(), {k, v});
      return true;
    }
    case 'u': {  // SETITEMS
      std::vector<Value*> kv = pop_mark();
      set_items(top(), kv);
      return true;
    }
    case 'a': case 'e': {  // APPEND, APPENDS
      std::vector<Value*> items = op == 'a' ? std::vector<Value*>{pop()} : pop_mark();
      if (top()->kind != Value::List) bad("APPEND to a " + std::string(kind_name(top()->kind)));
      top()->items.insert(top()->items.end(), items.begin(), items.end());
      return true;
    }
    default: {
      static const char* hex = "0123456789abcdef";
      bad(std::string("opcode 0x") + hex[op >> 4] + hex[op & 15] +
          " is not one torch.save writes for a state_dict (refused, nothing was executed)");
    }
  }
}

Value* Unpickler::run() {
  while (true) {
    if (at_ >= p_.size()) bad("the pickle ends without STOP (truncated?)");
    const auto op = static_cast<unsigned char>(p_[at_++]);
    if (!step(op)) break;
  }
  if (stack_.size() != 1 || !marks_.empty()) bad("STOP with " + std::to_string(stack_.size()) + " values on the stack");
  return stack_.back();
}

// The state_dict in the unpickled object (Archive::Select says which); `key` gets the
// top-level key it was found under.
const Value* find_state_dict(const Value* root, const Archive& ar, Archive::Select select, std::string& key) {
  if (root->kind != Value::Dict)
    ar.bad("holds a pickled " + std::string(kind_name(root->kind)) + ", not a state_dict (a dict of tensors)");
  auto entry = [&](const char* wanted) -> const Value* {
    for (size_t i = 0; i < root->items.size(); i += 2)
      if (root->items[i]->kind == Value::Str && root->items[i]->s == wanted && root->items[i + 1]->kind == Value::Dict)
        return root->items[i + 1];
    return nullptr;
  };
  const bool ema = select == Archive::Select::Ema;
  static const char* const model_keys[] = {"state_dict", "model", "model_state_dict"};
  static const char* const ema_keys[] = {"model_ema", "state_dict_ema"};  // torchvision's, timm's
  for (const char* k : ema ? std::span<const char* const>(ema_keys) : std::span<const char* const>(model_keys))
    if (const Value* d = entry(k)) {
      key = k;
      return d;
    }
  if (!ema) return root;
  std::string keys;  // what the file does hold, to name in the refusal
  for (size_t i = 0; i < root->items.size() && i < 40; i += 2)
    if (root->items[i]->kind == Value::Str) keys += (keys.empty() ? "'" : ", '") + root->items[i]->s + "'";
  ar.bad("holds no weight EMA: the EMA is read from a training checkpoint's 'model_ema' (torchvision's train.py "
         "--model-ema) or 'state_dict_ema' (timm's --model-ema) entry, and this file has neither (its top-level "
         "keys: " + (keys.empty() ? std::string("none named") : keys) + ")");
}

}  // namespace

const char* dtype_name(DType t) {
  static const char* names[] = {"float32", "float16", "bfloat16", "float64", "int64",
                                "int32",   "int16",   "int8",     "uint8",   "bool"};
  return names[static_cast<int>(t)];
}

size_t dtype_size(DType t) {
  static const size_t sizes[] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};
  return sizes[static_cast<int>(t)];
}

bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // bounded by the storage when parsed
  return n;
}

void Archive::bad(const std::string& what) const { throw UsageError("PyTorch file '" + path_ + "': " + what); }

Archive Archive::open(const std::string& path, Select select) {
  Archive a;
  a.path_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) a.bad("no such file");
  if (fs::is_directory(path, ec)) a.bad("is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) a.bad(std::string("cannot open it: ") + std::strerror(errno));
  a.bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) a.bad("cannot read it");
  if (const std::string problem = name_hash_problem(path, a.bytes_); !problem.empty()) a.bad(problem);
  a.parse(select);
  return a;
}

Archive Archive::from_bytes(std::string bytes, const std::string& name, Select select) {
  Archive a;
  a.path_ = name;
  a.bytes_ = std::move(bytes);
  a.parse(select);
  return a;
}

// One pass from the zip's entries through the unpickled object to the checked tensor list.
void Archive::parse(Select select) {
  if (bytes_.size() >= 2 && static_cast<unsigned char>(bytes_[0]) == 0x80 && bytes_[1] >= 2 && bytes_[1] <= 5)
    bad(legacy_format_problem(path_));
  std::map<std::string, ZipEntry> entries = read_zip(bytes_, [this](const std::string& w) { bad(w); });
  std::string top;  // the archive's folder ("archive", or the saved file's stem before PyTorch 2.x)
  for (const auto& [name, e] : entries) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (!top.empty()) bad("holds two data.pkl entries ('" + top + "data.pkl', '" + name + "')");
      top = name.substr(0, slash + 1);
    }
  }
  if (top.empty()) bad("has no <folder>/data.pkl entry: a zip archive, but not one torch.save wrote");
  // Everything in the archive is verified: a damaged byte anywhere is an error, not a weight.
  for (const auto& [name, e] : entries) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t done = 0; done < e.size;) {
      const uInt chunk = static_cast<uInt>(std::min<uint64_t>(e.size - done, 1u << 30));
      crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes_.data() + e.begin + done), chunk);
      done += chunk;
    }
    if (crc != e.crc) bad("zip entry '" + name + "' fails its CRC-32 (file damaged or incompletely copied)");
  }
  if (const auto bo = entries.find(top + "byteorder"); bo != entries.end()) {
    const std::string order = bytes_.substr(bo->second.begin, bo->second.size);
    if (order != "little") bad("byteorder is '" + order + "'; only little-endian files are read");
  }
  const ZipEntry& pkl = entries.at(top + "data.pkl");
  const std::string pickle = bytes_.substr(pkl.begin, pkl.size);
  Unpickler up(pickle, entries, top + "data/", *this);
  const Value* sd = find_state_dict(up.run(), *this, select, key_);
  const auto& kv = sd->items;
  // torchvision's EMA is an AveragedModel: its state_dict is the model's under "module."
  // plus the average's counter, which is no weight.
  auto averaged_counter = [&](size_t i) { return key_ == "model_ema" && kv[i]->s == "n_averaged"; };
  const std::string where = key_.empty() ? "state_dict" : "'" + key_ + "'";
  bool all_module = !kv.empty();
  for (size_t i = 0; i < kv.size(); i += 2) {
    if (kv[i]->kind != Value::Str) bad("the " + where + " has a " + std::string(kind_name(kv[i]->kind)) + " key");
    if (kv[i + 1]->kind != Value::TensorRef)
      bad(where + " entry '" + kv[i]->s + "' is a " + kind_name(kv[i + 1]->kind) + ", not a tensor");
    if (!averaged_counter(i)) all_module = all_module && kv[i]->s.rfind("module.", 0) == 0;
  }
  for (size_t i = 0; i < kv.size(); i += 2) {
    if (averaged_counter(i)) continue;
    Tensor t = kv[i + 1]->tensor;
    t.name = all_module ? kv[i]->s.substr(7) : kv[i]->s;  // a DDP-wrapped model's save
    const auto [at, fresh] = index_.emplace(t.name, tensors_.size());
    if (fresh) tensors_.push_back(std::move(t));
    else tensors_[at->second] = std::move(t);  // a repeated key: the last wins, in the first one's place
  }
  if (tensors_.empty()) bad("holds no tensors");
}

const Tensor* Archive::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// Element `index` (in storage elements) of t's storage, as a double (exact for every
// dtype read here but int64 beyond 2^53, which only counters hold).
double Archive::element(const Tensor& t, uint64_t index) const {
  const char* p = bytes_.data() + t.storage_begin + index * dtype_size(t.dtype);
  switch (t.dtype) {
    case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return safetensors::half_to_float(h); }
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;  // bfloat16 is float32's upper half
      float v;
      std::memcpy(&v, &bits, 4);
      return v;
    }
    case DType::F64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::I16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::I8: return static_cast<signed char>(*p);
    case DType::U8: return static_cast<unsigned char>(*p);
    case DType::Bool: return *p != 0;
  }
  return 0;
}

void Archive::read_f32(const Tensor& t, float* out) const {
  if (!is_float(t.dtype))
    bad("tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) + ", expected float32, float16, bfloat16 or float64");
  const size_t n = static_cast<size_t>(t.numel());
  const size_t rank = t.shape.size();
  // C order over a strided view: the storage index advances by stride[d] in dimension d.
  std::vector<int64_t> idx(rank, 0);
  uint64_t at = static_cast<uint64_t>(t.offset);
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(element(t, at));  // float64 rounds to nearest, as HDF5 converts
    for (size_t d = rank; d-- > 0;) {
      at += static_cast<uint64_t>(t.stride[d]);
      if (++idx[d] < t.shape[d]) break;
      at -= static_cast<uint64_t>(t.stride[d] * t.shape[d]);
      idx[d] = 0;
    }
  }
}

int64_t Archive::read_int_scalar(const Tensor& t) const {
  if (t.numel() != 1) bad("tensor '" + t.name + "' should hold one value, has " + std::to_string(t.numel()));
  const uint64_t at = static_cast<uint64_t>(t.offset);
  if (t.dtype == DType::I64) {
    int64_t v;
    std::memcpy(&v, bytes_.data() + t.storage_begin + at * 8, 8);
    return v;
  }
  const double v = element(t, at);
  if (!(v >= 0 && v < 9.0e15) || v != static_cast<double>(static_cast<int64_t>(v)))
    bad("tensor '" + t.name + "' should hold a non-negative integer");
  return static_cast<int64_t>(v);
}

std::string legacy_format_problem(const std::string& path) {
  fs::path out = fs::path(path).filename();
  out.replace_extension(".zip.pth");
  return "is in PyTorch's legacy format (torch.save before PyTorch 1.6, or _use_new_zipfile_serialization=False), "
         "which resnet_ddp does not read; re-save it once in the zip format: /usr/bin/python3 -c 'import torch; "
         "torch.save(torch.load(\"" + path + "\", weights_only=True), \"" + out.string() + "\")' "
         "(or convert it with tools/torch_to_h5.py, docs/interop.md)";
}

std::string name_hash_problem(const std::string& path, const std::string& bytes) {
  const std::string name = fs::path(path).filename().string();
  for (size_t dash = name.find('-'); dash != std::string::npos; dash = name.find('-', dash + 1)) {
    size_t end = dash + 1;
    while (end < name.size() && ((name[end] >= '0' && name[end] <= '9') || (name[end] >= 'a' && name[end] <= 'f'))) ++end;
    if (end >= name.size() || name[end] != '.') continue;  // torch.hub's first "-<hex>." match
    const std::string prefix = name.substr(dash + 1, end - dash - 1);
    if (prefix.size() < 8 || prefix.size() > 64) return "";
    const std::string digest = sha256_hex(bytes.data(), bytes.size());
    if (digest.compare(0, prefix.size(), prefix) == 0) return "";
    return "its name says its SHA-256 starts with " + prefix + " (torch.hub's rule for '<name>-<hash>.pth'), but "
           "its SHA-256 is " + digest + ": the file is damaged or incompletely downloaded (download it again; "
           "if '-" + prefix + "' is not a hash, rename the file)";
  }
  return "";
}

}  // namespace rd::io::torch_pth
