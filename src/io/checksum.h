// Whole-file checksum of checkpoints (internal to src/io).
//
// HDF5's parser is not hardened against damaged files (a flipped bit in its metadata
// can crash or hang it), so a file we wrote is verified before HDF5 sees it: the
// first kChecksumBlock bytes are an HDF5 user block holding a text header
//   "resnet_ddp checksum v1\nbytes <file size>\ncrc32 <8 hex digits>\n" + NULs
// with the CRC-32 (zlib) of every byte after the block. Files without the header
// (older versions, tools/torch_to_h5.py, h5py) are opened as before.
// See docs/checkpoint_format.md.
#pragma once

#include <hdf5.h>

#include <string>

#include "resnet_ddp/errors.h"

namespace rd::io {

constexpr hsize_t kChecksumBlock = 512;

// A failed write of the checkpoint file (the writer turns it into its message).
struct WriteError : Error {
  using Error::Error;
};

// Writes the header into `file`'s user block. Throws WriteError.
void stamp_checksum(const std::string& file);

// Why `path` fails its checksum header, or "" when it matches or has none.
std::string checksum_problem(const std::string& path);

}  // namespace rd::io
