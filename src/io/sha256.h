// SHA-256 (OpenSSL's libcrypto), for torch.hub's file-name checksum rule (torch_pth.cpp):
// torchvision's weight files are named <name>-<first hex digits of their SHA-256>.pth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rd::io {

// The lowercase hex digest (64 digits) of `size` bytes at `data`; throws rd::Error if
// libcrypto fails.
std::string sha256_hex(const void* data, size_t size);

}  // namespace rd::io
