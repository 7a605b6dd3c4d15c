// Fuzz target: the safetensors reader (src/io/safetensors.cpp), which, unlike HDF5,
// is our own parser of raw bytes, so the fuzzer mutates the file itself: header length,
// JSON (nesting, escapes, numbers, duplicates), dtypes, shapes, offsets, metadata. Each
// input is parsed in memory and every tensor read and converted; then the same bytes go
// through CheckpointReader as a .safetensors file (weights_file_fixture.h).

#include <string>
#include <vector>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/safetensors.h"
#include "weights_file_fixture.h"

using namespace rd;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::WeightsFileFixture fx("rd_fuzz_st", "input.safetensors");
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  namespace st = io::safetensors;
  try {
    const st::File f = st::File::from_bytes(bytes, "fuzz input");
    std::vector<float> buf;
    for (const st::Entry& e : f.tensors()) {
      try {
        if (e.dtype == st::DType::I64 || e.dtype == st::DType::I32) {
          (void)f.read_int_scalar(e);
        } else {
          buf.resize(static_cast<size_t>(e.numel()));
          f.read_f32(e, buf.data());
        }
      } catch (const Error&) {
      }
    }
    if (f.metadata().count("class_names"))
      (void)st::parse_json_string_array(f.metadata().at("class_names"), "class_names");
  } catch (const Error&) {
  }
  fx.read_through_checkpoint_reader(bytes, size % 2 == 0);  // weights-only (--init) or full (predict)
  return 0;
}
