// The .pth reader's pieces without PyTorch (tests/train/pth_reader_check.py compares
// it with torch.load): SHA-256 (libcrypto's EVP) against FIPS 180-4's examples,
// torch.hub's name rule, and refusals of bytes no torch.save writes.
#include <catch2/catch.hpp>
#include <string>

#include "io/sha256.h"
#include "io/torch_pth.h"
#include "resnet_ddp/errors.h"

using namespace rd;
using namespace rd::io;

TEST_CASE("sha256: libcrypto's digest of FIPS 180-4's examples", "[torch_pth]") {
  auto hex = [](const std::string& s) { return sha256_hex(s.data(), s.size()); };
  CHECK(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");  // 56 bytes: two padding blocks
  CHECK(hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  CHECK(hex(std::string(64, 'a')) == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST_CASE("torch_pth: torch.hub's name rule", "[torch_pth]") {
  const std::string abc = "abc";  // SHA-256 ba7816bf...
  using torch_pth::name_hash_problem;
  CHECK(name_hash_problem("/x/resnet50-ba7816bf.pth", abc).empty());
  CHECK(name_hash_problem("resnet50-ba7816bf8f01cfea.pth", abc).empty());
  CHECK_THAT(name_hash_problem("resnet50-ba7816be.pth", abc), Catch::Contains("SHA-256 starts with ba7816be"));
  CHECK_THAT(name_hash_problem("res-net-00000000.pth", abc), Catch::Contains("its SHA-256 is ba7816bf"));
  CHECK(name_hash_problem("model-1.pth", abc).empty());        // under 8 digits: not a hash
  CHECK(name_hash_problem("model-epoch10.pth", abc).empty());  // not hex
  CHECK(name_hash_problem("model.pth", abc).empty());
}

TEST_CASE("torch_pth: bytes no torch.save writes are refused", "[torch_pth]") {
  using torch_pth::Archive;
  CHECK_THROWS_WITH(Archive::from_bytes("", "mem"), Catch::Contains("'mem': only 0 bytes"));
  CHECK_THROWS_WITH(Archive::from_bytes(std::string(100, 'x'), "mem"), Catch::Contains("no zip end record"));
  CHECK_THROWS_WITH(Archive::from_bytes(std::string("\x80\x02}q\x00.", 6), "mem"), Catch::Contains("legacy format"));
  // An empty zip: end record only.
  std::string eocd("PK\x05\x06", 4);
  eocd += std::string(18, '\0');
  CHECK_THROWS_WITH(Archive::from_bytes(eocd, "mem"), Catch::Contains("has no <folder>/data.pkl entry"));
  // A directory claiming entries it does not have.
  std::string lying = eocd;
  lying[10] = 3;
  CHECK_THROWS_WITH(Archive::from_bytes(lying, "mem"), Catch::Contains("zip directory is damaged"));
  CHECK(std::string(torch_pth::dtype_name(torch_pth::DType::BF16)) == "bfloat16");
}
