// The C++ half of check_ema_vs_torch.py: torchvision's ExponentialMovingAverage
// arithmetic through Backend::ema_update (CPU backend) and ModelEma::average_count.
// stdin: "DECAY COUNT UPDATES", then per update "RESET NBT" and COUNT floats (the
// model's parameters and float buffers, flattened). The first update (and any after a
// RESET) copies, as AveragedModel does while n_averaged is 0. stdout: the average's
// COUNT floats and its num_batches_tracked, %.9g.
#include <cstdio>
#include <iostream>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/train/model_ema.h"

int main() {
  double decay = 0;
  size_t count = 0;
  int updates = 0;
  if (!(std::cin >> decay >> count >> updates)) return 1;
  auto be = rd::make_cpu_backend({});
  auto avg = be->allocate(count * sizeof(float));
  auto cur = be->allocate(count * sizeof(float));
  float* a = static_cast<float*>(avg.get());
  float* c = static_cast<float*>(cur.get());
  const float d = static_cast<float>(decay), omd = static_cast<float>(1.0 - decay);
  int64_t n_averaged = 0, nbt = 0;
  std::vector<float> host(count);
  for (int u = 0; u < updates; ++u) {
    int reset = 0;
    int64_t model_nbt = 0;
    std::cin >> reset >> model_nbt;
    for (float& v : host) std::cin >> v;
    if (!std::cin) return 1;
    be->copy_from_host(c, host.data(), count * sizeof(float));
    be->ema_update(a, c, count, d, omd, n_averaged == 0);
    nbt = n_averaged == 0 ? model_nbt : rd::train::ModelEma::average_count(nbt, model_nbt, d, omd);
    n_averaged = reset ? 0 : n_averaged + 1;
  }
  be->copy_to_host(host.data(), a, count * sizeof(float));
  for (float v : host) std::printf("%.9g\n", static_cast<double>(v));
  std::printf("%lld\n", static_cast<long long>(nbt));
  return 0;
}
