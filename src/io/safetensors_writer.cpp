// Writing a model's state_dict as safetensors (see safetensors.h).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "resnet_ddp/errors.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/io/safetensors.h"
#include "resnet_ddp/nn/resnet.h"

namespace fs = std::filesystem;

namespace rd::io::safetensors {

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error("writing '" + tmp + "' failed: " + std::strerror(w < 0 ? errno : EIO));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// The file's bytes, in state_dict order: header, then each tensor from the model.
void write_file(int fd, const std::string& tmp, ResNet& model, const std::map<std::string, std::string>& md) {
  const std::vector<StateEntry> order = state_dict_order(model);
  std::vector<Entry> entries;
  uint64_t at = 0;
  for (const StateEntry& s : order) {
    Entry e;
    e.name = s.name;
    if (s.arena) {
      e.dtype = DType::F32;
      e.shape = s.arena->slice(s.slice).shape.vec();
    } else {
      e.dtype = DType::I64;  // torch's num_batches_tracked: int64, shape ()
    }
    e.begin = at;
    e.end = at + static_cast<uint64_t>(e.numel()) * dtype_size(e.dtype);
    at = e.end;
    entries.push_back(std::move(e));
  }
  const std::string header = make_header(entries, md);
  write_all(fd, header.data(), header.size(), tmp);
  std::vector<float> host;
  for (const StateEntry& s : order) {
    if (!s.arena) {
      const int64_t nbt = model.num_batches_tracked();
      write_all(fd, &nbt, sizeof nbt, tmp);  // little-endian host (static_assert in safetensors.cpp)
      continue;
    }
    const ParamSlice& p = s.arena->slice(s.slice);
    host.resize(p.count);
    model.backend().copy_to_host(host.data(), s.arena->data() + p.offset, p.count * sizeof(float));
    write_all(fd, host.data(), p.count * sizeof(float), tmp);
  }
}

// Temp file in the destination's directory, fsync, rename, fsync of the directory: a
// failure or crash leaves either the old file or the complete new one.
}  // namespace

void write_model(const std::string& out, ResNet& model, const std::map<std::string, std::string>& md) {
  const fs::path final_path(out);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  std::string tmp_name = ".";  // built in steps: GCC 12 warns (-Wrestrict) on the one-line form
  tmp_name += final_path.filename().string();
  tmp_name += ".tmp." + std::to_string(getpid());
  const std::string tmp = (dir / tmp_name).string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write '" + out + "': cannot create '" + tmp + "': " + std::strerror(errno));
  try {
    write_file(fd, tmp, model, md);
    if (::fsync(fd) != 0) throw Error("fsync of '" + tmp + "' failed: " + std::strerror(errno));
    if (::close(fd) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw Error("closing '" + tmp + "' failed: " + std::strerror(err));
    }
  } catch (const Error& e) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + out + "': " + e.what() + "; nothing was written");
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot write '" + out + "': rename failed: " + std::strerror(err) + "; nothing was written");
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // durability of the rename only; the file itself is complete
    ::close(dfd);
  }
}

}  // namespace rd::io::safetensors
