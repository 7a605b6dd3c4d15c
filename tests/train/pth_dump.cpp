// pth_dump IN.pth OUT: what the trainer's .pth tensor source (src/io/torch_source.cpp)
// reads from IN, for tests/train/pth_reader_check.py to compare with torch.load:
// per state_dict tensor, a line "float NAME RANK D0 D1 ..." followed by its float32
// values (raw, little-endian), or "counter NAME VALUE". Exit 2 with the reader's message
// on a refused file.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "io/tensor_source.h"
#include "resnet_ddp/errors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: pth_dump IN.pth OUT\n";
    return 1;
  }
  try {
    std::unique_ptr<rd::io::TensorSource> src = rd::io::open_torch_source(argv[1]);
    (void)src->read_meta(true);
    std::ofstream out(argv[2], std::ios::binary);
    std::vector<float> values;
    for (const std::string& name : src->names("state_dict")) {
      if (const std::optional<int64_t> c = src->counter("state_dict", name)) {
        out << "counter " << name << " " << *c << "\n";
        continue;
      }
      const std::vector<int64_t> shape = src->float_shape("state_dict", name).value();
      size_t n = 1;
      out << "float " << name << " " << shape.size();
      for (int64_t d : shape) {
        out << " " << d;
        n *= static_cast<size_t>(d);
      }
      out << "\n";
      values.assign(n, 0.0f);
      src->read_floats("state_dict", name, values.data());
      out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(n * sizeof(float)));
    }
    if (!out.flush()) throw rd::Error(std::string("cannot write ") + argv[2]);
  } catch (const rd::Error& e) {
    std::cerr << "pth_dump: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
