// Built when the CUDA backend is not compiled in: every request for it is a
// clear error, and device discovery reports zero GPUs.
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

namespace rd {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw Error(cuda_unavailable_reason());
}
bool cuda_backend_available() { return false; }
int cuda_device_count() { return 0; }
bool cuda_backend_built() { return false; }
std::string cuda_unavailable_reason() {
  return "this resnet_ddp was built without the CUDA backend: load the CUDA toolkit (with cuDNN and NCCL) on "
         "the login node, e.g. `module load cuda`, then rebuild with `make clean && make CUDA=ON`";
}

}  // namespace rd
