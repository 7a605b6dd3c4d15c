// The MixUp / CutMix / RASampler pieces as a command-line probe for
// check_mix_vs_torch.py, which compares them with torch / torchvision's reference:
//   mix_probe loss K LAM SMOOTHING LOGITS.f32 LABELS.i32 PARTNERS.i32 DLOGITS_OUT.f32
//       prints the mean loss; writes d(mean loss)/d(logits) (CPU backend)
//   mix_probe mix N C H W CUTMIX LAM X0 Y0 X1 Y1 IN.f32 OUT.f32   (NCHW, CPU backend)
//   mix_probe box LAMBDA R_X R_Y H W      prints x0 y0 x1 y1 target_lambda
//   mix_probe draws MIXUP_ALPHA CUTMIX_ALPHA SEED COUNT H W
//       prints one line per step: kind lambda x0 y0 x1 y1 target_lambda
//   mix_probe target LABEL PARTNER LAMBDA prints the class accuracy counts as right
//   mix_probe ra N WORLD RANK REPS SEED EPOCH   prints RASampler's indices
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/mixing.h"

using namespace rd;

namespace {

template <class T> std::vector<T> read_raw(const std::string& path, size_t count) {
  std::vector<T> v(count);
  std::ifstream f(path, std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T))))
    throw Error("mix_probe: cannot read " + std::to_string(count) + " values from " + path);
  return v;
}

template <class T> void write_raw(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  if (!f) throw Error("mix_probe: cannot write " + path);
}

int64_t i64(const char* s) { return std::strtoll(s, nullptr, 10); }
double f64(const char* s) { return std::strtod(s, nullptr); }

int loss(char** a) {  // K LAM SMOOTHING LOGITS LABELS PARTNERS DLOGITS_OUT
  auto be = make_cpu_backend();
  const int64_t k = i64(a[0]);
  std::ifstream f(a[3], std::ios::binary | std::ios::ate);
  const int64_t n = static_cast<int64_t>(f.tellg()) / 4 / k;
  const auto z = read_raw<float>(a[3], static_cast<size_t>(n * k));
  const auto labels = read_raw<int32_t>(a[4], static_cast<size_t>(n));
  const auto partners = read_raw<int32_t>(a[5], static_cast<size_t>(n));
  Tensor logits = be->matrix(n, k), dlogits = be->matrix(n, k);
  be->copy_from_host(logits.data, z.data(), z.size() * 4);
  const double sum = be->softmax_xent_mixed(logits, labels.data(), partners.data(), static_cast<float>(f64(a[1])),
                                            static_cast<float>(f64(a[2])), 1.f, &dlogits, nullptr);
  std::vector<float> dz(z.size());
  be->copy_to_host(dz.data(), dlogits.data, dz.size() * 4);
  write_raw(a[6], dz);
  std::printf("%.17g\n", sum / static_cast<double>(n));
  return 0;
}

int mix(char** a) {  // N C H W CUTMIX LAM X0 Y0 X1 Y1 IN OUT
  auto be = make_cpu_backend();
  const int64_t n = i64(a[0]), c = i64(a[1]), h = i64(a[2]), w = i64(a[3]);
  math::ImageMix m;
  m.cutmix = i64(a[4]) != 0;
  m.lambda = static_cast<float>(f64(a[5]));
  m.x0 = i64(a[6]), m.y0 = i64(a[7]), m.x1 = i64(a[8]), m.y1 = i64(a[9]);
  const auto x = read_raw<float>(a[10], static_cast<size_t>(n * c * h * w));
  Tensor src = be->activation(n, c, h, w), dst = be->activation(n, c, h, w);
  be->copy_from_host_nchw(x.data(), src);
  be->mix_images(src, dst, m);
  std::vector<float> y(x.size());
  be->copy_to_host_nchw(dst, y.data());
  write_raw(a[11], y);
  return 0;
}

void print_mixing(const char* kind, double lambda, const train::BatchMixing& m) {
  std::printf("%s %.17g %lld %lld %lld %lld %.9g\n", kind, lambda, static_cast<long long>(m.image.x0),
              static_cast<long long>(m.image.y0), static_cast<long long>(m.image.x1),
              static_cast<long long>(m.image.y1), static_cast<double>(m.target_lambda));
}

int draws(char** a) {  // MIXUP_ALPHA CUTMIX_ALPHA SEED COUNT H W
  const train::MixingOptions o{f64(a[0]), f64(a[1])};
  train::MixingDrawKey key;
  key.seed = static_cast<uint64_t>(i64(a[2]));
  for (int64_t s = 0; s < i64(a[3]); ++s) {
    key.step = s;
    const auto m = train::draw_batch_mixing(o, key, i64(a[4]), i64(a[5]));
    print_mixing(m.image.cutmix ? "cutmix" : "mixup", m.image.lambda, m);
  }
  return 0;
}

int ra(char** a) {  // N WORLD RANK REPS SEED EPOCH
  data::RASampler s(static_cast<size_t>(i64(a[0])), static_cast<int>(i64(a[1])), static_cast<int>(i64(a[2])),
                    static_cast<int>(i64(a[3])), true, static_cast<uint64_t>(i64(a[4])));
  s.set_epoch(i64(a[5]));
  for (int64_t i : s.indices()) std::printf("%lld\n", static_cast<long long>(i));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "loss" && argc == 9) return loss(argv + 2);
    if (cmd == "mix" && argc == 14) return mix(argv + 2);
    if (cmd == "box" && argc == 7) {
      const auto m = train::cutmix_box(f64(argv[2]), i64(argv[3]), i64(argv[4]), i64(argv[5]), i64(argv[6]));
      print_mixing("cutmix", f64(argv[2]), m);
      return 0;
    }
    if (cmd == "draws" && argc == 8) return draws(argv + 2);
    if (cmd == "target" && argc == 5) {
      std::printf("%d\n", train::mixed_target_class(static_cast<int32_t>(i64(argv[2])),
                                                    static_cast<int32_t>(i64(argv[3])),
                                                    static_cast<float>(f64(argv[4]))));
      return 0;
    }
    if (cmd == "ra" && argc == 8) return ra(argv + 2);
    std::fprintf(stderr, "mix_probe: bad arguments (see the top of tests/train/mix_probe.cpp)\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mix_probe: %s\n", e.what());
    return 1;
  }
}
