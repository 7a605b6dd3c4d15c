// The safetensors reader and writer (src/io/safetensors.cpp) without a model: exact
// 16-bit widening, header round trip, the JSON corners, and refusals. The end-to-end
// tests (tests/e2e/safetensors_export.sh, weights_errors.sh) cover files from PyTorch.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/safetensors.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::io::safetensors;

namespace {

// A file of one tensor `dtype`/`shape` over `data`, with `extra` JSON members (",...").
std::string one_tensor(const std::string& dtype, const std::string& shape, const std::string& data,
                       const std::string& extra = "") {
  const std::string json = "{\"t\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[0," +
                           std::to_string(data.size()) + "]}" + extra + "}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return out + json + data;
}

std::string u16s(std::initializer_list<uint16_t> v) {
  std::string s;
  for (uint16_t x : v) s.append(reinterpret_cast<const char*>(&x), 2);
  return s;
}

std::string refusal(const std::string& bytes) {
  try {
    (void)File::from_bytes(bytes, "mem");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: F16 and BF16 widen exactly, specials included", "[safetensors]") {
  const File f16 = File::from_bytes(
      one_tensor("F16", "[10]", u16s({0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E00})),
      "mem");
  float v[10];
  f16.read_f32(f16.tensors().at(0), v);
  CHECK(v[0] == 0.0f);
  CHECK(std::signbit(v[1]));
  CHECK(v[2] == std::ldexp(1.0f, -24));          // smallest subnormal
  CHECK(v[3] == std::ldexp(1023.0f, -24));       // largest subnormal
  CHECK(v[4] == std::ldexp(1.0f, -14));          // smallest normal
  CHECK(v[5] == 1.0f);
  CHECK(v[6] == 65504.0f);
  CHECK(v[7] == std::numeric_limits<float>::infinity());
  CHECK(v[8] == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(v[9]));

  const File bf = File::from_bytes(one_tensor("BF16", "[3]", u16s({0x3F80, 0xC000, 0x0001})), "mem");
  bf.read_f32(bf.tensors().at(0), v);
  CHECK(v[0] == 1.0f);
  CHECK(v[1] == -2.0f);
  CHECK(v[2] == std::ldexp(1.0f, -133));
}

TEST_CASE("safetensors: make_header round trip, 8-byte aligned, metadata escapes", "[safetensors]") {
  std::vector<Entry> entries(3);
  entries[0].name = "a.weight";
  entries[0].shape = {2, 3};
  entries[0].begin = 0;
  entries[0].end = 24;
  entries[1].name = "a.num_batches_tracked";
  entries[1].dtype = DType::I64;
  entries[1].begin = 24;
  entries[1].end = 32;
  entries[2].name = "empty";
  entries[2].shape = {0, 5};
  entries[2].begin = entries[2].end = 32;
  const std::vector<std::string> classes = {"a\"b", "tab\there", "caf\xC3\xA9", "line\nbreak", "\\"};
  std::map<std::string, std::string> md = {{"class_names", json_string_array(classes)}, {"k", "v"}};
  const std::string header = make_header(entries, md);
  CHECK(header.size() % 8 == 0);
  std::string data(32, '\0');
  const float w[6] = {1, 2, 3, 4, 5, 6};
  const int64_t nbt = 42;
  std::memcpy(data.data(), w, 24);
  std::memcpy(data.data() + 24, &nbt, 8);
  const File f = File::from_bytes(header + data, "mem");
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.metadata() == md);
  CHECK(parse_json_string_array(f.metadata().at("class_names"), "x") == classes);
  const Entry* a = f.find("a.weight");
  REQUIRE(a);
  CHECK(a->shape == std::vector<int64_t>{2, 3});
  float got[6];
  f.read_f32(*a, got);
  CHECK(std::memcmp(got, w, sizeof w) == 0);
  CHECK(f.read_int_scalar(*f.find("a.num_batches_tracked")) == 42);
  CHECK(f.find("empty")->numel() == 0);
}

TEST_CASE("safetensors: JSON corners", "[safetensors]") {
  // A surrogate pair is one code point (U+1F600), in a metadata value.
  const File f = File::from_bytes(one_tensor("F32", "[1]", std::string(4, '\0'),
                                             ",\"__metadata__\":{\"e\":\"\\ud83d\\ude00 \\u00e9\\/\"}"),
                                  "mem");
  CHECK(f.metadata().at("e") == "\xF0\x9F\x98\x80 \xC3\xA9/");
  CHECK_NOTHROW(File::from_bytes(one_tensor("F32", "[1]", std::string(4, '\0'), ",\"__metadata__\":null"), "m"));
  CHECK_THAT(refusal(one_tensor("F32", "[1]", std::string(4, '\0'), ",\"__metadata__\":{\"e\":\"\\ud83d\"}")),
             Catch::Contains("unpaired surrogate"));
  CHECK_THAT(refusal(one_tensor("F32", "[1]", std::string(4, '\0'), ",\"t\":{}")), Catch::Contains("duplicate key"));
  CHECK_THAT(refusal(one_tensor("F32", "[1e0]", std::string(4, '\0'))), Catch::Contains("non-negative integer"));
  CHECK_THAT(refusal(one_tensor("F32", "[1.0]", std::string(4, '\0'))), Catch::Contains("non-negative integer"));
  CHECK_THAT(refusal(one_tensor("F32", "[18446744073709551616]", std::string(4, '\0'))),
             Catch::Contains("non-negative integer"));
  CHECK_THAT(refusal(one_tensor("F32", "[4294967296,4294967296]", std::string(4, '\0'))),
             Catch::Contains("does not fill"));  // numel overflows u64 * 4
  CHECK_THAT(refusal(one_tensor("F32", "[1,2,3,4,5,6,7,8,9]", std::string(4, '\0'))), Catch::Contains("rank 9"));
  CHECK_THAT(refusal(one_tensor("F32", "[1]", std::string(4, '\0'), ",\"x\":\"a\x01\"")),
             Catch::Contains("control character"));
}

TEST_CASE("safetensors: refusals name the file and the tensor", "[safetensors]") {
  const std::string good = one_tensor("F32", "[2]", std::string(8, '\0'));
  CHECK_NOTHROW(File::from_bytes(good, "mem"));
  CHECK_THAT(refusal(good.substr(0, 7)), Catch::StartsWith("safetensors file 'mem': only 7 bytes"));
  CHECK_THAT(refusal(good.substr(0, good.size() - 1)), Catch::Contains("tensor 't': data_offsets [0, 8] end past"));
  CHECK_THAT(refusal(good + "x"), Catch::Contains("1 bytes after the last tensor belong to no tensor"));
  CHECK_THAT(refusal(one_tensor("F64", "[1]", std::string(8, '\0'))), Catch::Contains("dtype F64 is not supported"));
  CHECK_THAT(refusal(one_tensor("F32", "[3]", std::string(8, '\0'))), Catch::Contains("does not fill its 8 bytes"));
  std::string not_json = good;
  not_json[8] = '[';
  CHECK_THAT(refusal(not_json), Catch::Contains("does not start with '{'"));
  const File f = File::from_bytes(one_tensor("F32", "[2]", std::string(8, '\0')), "mem");
  CHECK_THROWS_WITH(f.read_int_scalar(f.tensors().at(0)), Catch::Contains("should hold one value"));
}

TEST_CASE("safetensors: sniffing PyTorch files and safetensors content", "[safetensors]") {
  const fs::path dir = fs::temp_directory_path() / ("rd_sniff." + std::to_string(getpid()));
  fs::create_directories(dir);
  auto put = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  CHECK(sniff(put("a.pth", std::string("PK\x03\x04rest", 8))) == Kind::TorchZip);
  CHECK(sniff(put("b.pt", std::string("\x80\x02}q", 4))) == Kind::TorchPickle);
  CHECK(sniff(put("c.bin", one_tensor("F32", "[1]", std::string(4, '\0')))) == Kind::Safetensors);
  CHECK(sniff(put("d.safetensors", "xy")) == Kind::Safetensors);  // by name: parsed, then refused precisely
  CHECK(sniff(put("e.h5", "\x89HDF\r\n\x1a\n")) == Kind::Other);
  CHECK(torch_file_problem((dir / "a.pth").string()).empty());  // the zip format is read (torch_pth.h)
  CHECK_THAT(torch_file_problem((dir / "b.pt").string()), Catch::Contains("legacy format"));
  CHECK(torch_file_problem((dir / "c.bin").string()).empty());
  CHECK_THROWS_WITH(File::open((dir / "d.safetensors").string()), Catch::Contains("d.safetensors': only 2 bytes"));
  fs::remove_all(dir);
}
