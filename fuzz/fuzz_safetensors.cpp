// Fuzz target: the safetensors reader (src/io/safetensors.cpp), which, unlike HDF5,
// is our own parser of raw bytes, so the fuzzer mutates the file itself: header length,
// JSON (nesting, escapes, numbers, duplicates), dtypes, shapes, offsets, metadata. Each
// input is parsed in memory and every tensor read and converted; then the same bytes go
// through CheckpointReader as a .safetensors file (info's check_tensors and --init's
// load_model into a resnet_tiny). rd::Error is a clean refusal; anything else is a finding.

#include <string>
#include <vector>

#include "h5_edit.h"
#include "scratch_dir.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/io/safetensors.h"

using namespace rd;

namespace {

struct Fixture {
  fuzz::ScratchDir scratch{"rd_fuzz_st"};
  const std::string path = scratch.path + "/input.safetensors";
  std::unique_ptr<Backend> be;
  std::unique_ptr<ResNet> model;
  Fixture() {
    be = make_cpu_backend();
    ResNetConfig cfg;
    cfg.arch = "resnet_tiny";
    cfg.num_classes = 3;
    model = std::make_unique<ResNet>(*be, cfg);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
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
  fuzz::spit(fx.path, std::vector<char>(bytes.begin(), bytes.end()));
  try {
    io::CheckpointReader r(fx.path, size % 2 == 0);  // weights-only (--init) or full (predict)
    (void)r.check_tensors();
    (void)r.load_model(*fx.model, true);
  } catch (const Error&) {
  }
  return 0;
}
