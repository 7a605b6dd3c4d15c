// Built when the CUDA backend is not compiled in: every request for it is a
// clear error, and device discovery reports zero GPUs.
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"

namespace rd {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  throw Error("this resnet_ddp was built without the CUDA backend "
              "(configure with -DRESNET_DDP_CUDA=ON on a machine with nvcc, cuDNN and NCCL)");
}
bool cuda_backend_available() { return false; }
int cuda_device_count() { return 0; }

}  // namespace rd
