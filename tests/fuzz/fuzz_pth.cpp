// Fuzz target: the .pth reader (src/io/torch_pth.cpp): our zip directory parser and
// restricted unpickler over raw bytes. Every zip entry's CRC-32 is verified, so mutated
// file bytes mostly stop at the CRC; the first input byte therefore picks the mode:
//   even: the rest is the file itself (zip records, CRCs, sizes, truncation);
//   odd:  the rest is archive/data.pkl, which this target wraps in a well-formed zip with
//         fixed storages (data/0: 16 float32, data/1: one int64, data/2: 8 float16), so
//         mutations reach the unpickler (opcodes, memo, marks, globals, tensor views).
// Each input is parsed in memory and every tensor read; then the same file goes through
// CheckpointReader as a .pth (weights_file_fixture.h).
#include <zlib.h>

#include <string>
#include <vector>

#include "io/torch_pth.h"
#include "resnet_ddp/errors.h"
#include "weights_file_fixture.h"

using namespace rd;

namespace {

void put_le(std::string& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

// A stored (uncompressed) zip of `entries`, as torch.save lays it out.
std::string make_zip(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out, dir;
  for (const auto& [name, data] : entries) {
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(data.data()),
                                                      static_cast<uInt>(data.size())));
    const uint64_t local = out.size();
    put_le(out, 0x04034b50, 4), put_le(out, 20, 2), put_le(out, 0, 2), put_le(out, 0, 2), put_le(out, 0, 4);
    put_le(out, crc, 4), put_le(out, data.size(), 4), put_le(out, data.size(), 4);
    put_le(out, name.size(), 2), put_le(out, 0, 2);
    out += name + data;
    put_le(dir, 0x02014b50, 4), put_le(dir, 20, 2), put_le(dir, 20, 2), put_le(dir, 0, 2), put_le(dir, 0, 2);
    put_le(dir, 0, 4), put_le(dir, crc, 4), put_le(dir, data.size(), 4), put_le(dir, data.size(), 4);
    put_le(dir, name.size(), 2), put_le(dir, 0, 2), put_le(dir, 0, 2), put_le(dir, 0, 2), put_le(dir, 0, 2);
    put_le(dir, 0, 4), put_le(dir, local, 4);
    dir += name;
  }
  const uint64_t dir_at = out.size();
  out += dir;
  put_le(out, 0x06054b50, 4), put_le(out, 0, 2), put_le(out, 0, 2);
  put_le(out, entries.size(), 2), put_le(out, entries.size(), 2), put_le(out, dir.size(), 4), put_le(out, dir_at, 4);
  put_le(out, 0, 2);
  return out;
}

std::string wrap_pickle(const std::string& pickle) {
  std::string f32, i64, f16;
  for (int i = 0; i < 16; ++i) {
    const float v = 0.25f * static_cast<float>(i) - 1.0f;
    f32.append(reinterpret_cast<const char*>(&v), 4);
  }
  put_le(i64, 7, 8);
  for (int i = 0; i < 8; ++i) put_le(f16, 0x3C00u + static_cast<unsigned>(i), 2);
  return make_zip({{"archive/data.pkl", pickle}, {"archive/data/0", f32}, {"archive/data/1", i64},
                   {"archive/data/2", f16}, {"archive/version", "3\n"}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::WeightsFileFixture fx("rd_fuzz_pth", "input.pth");
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string bytes = data[0] % 2 ? wrap_pickle(rest) : rest;
  namespace tp = io::torch_pth;
  try {
    const tp::Archive a = tp::Archive::from_bytes(bytes, "fuzz input");
    std::vector<float> buf;
    for (const tp::Tensor& t : a.tensors()) {
      try {
        if (tp::is_float(t.dtype)) {
          buf.resize(static_cast<size_t>(t.numel()));
          a.read_f32(t, buf.data());
        } else {
          (void)a.read_int_scalar(t);
        }
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  fx.read_through_checkpoint_reader(bytes, data[0] & 2);  // weights-only (--init) or full (predict: refused)
  return 0;
}
