// SHA-256 through OpenSSL's libcrypto (EVP): its implementations use the CPU's SHA
// extensions where present, and one less crypto routine is ours to get right.
#include "io/sha256.h"

#include <openssl/evp.h>

#include "resnet_ddp/errors.h"

namespace rd::io {

std::string sha256_hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr) != 1 || length != 32)
    throw Error("SHA-256: OpenSSL's EVP_Digest failed");
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned int i = 0; i < length; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

}  // namespace rd::io
