// resnet_ddp side of the optimizer trajectory tests (tests/train/check_optimizers_vs_torch.py).
//
//   optim_driver DIR --device cpu|cuda --optimizer NAME --lr X [--weight-decay X]
//                [--norm-weight-decay X] [--bias-weight-decay X] [--momentum X] [--nesterov]
//                [--clip-grad-norm X]
//
// DIR holds spec.txt (one parameter a line: its name, then its dimensions), init.bin (the
// parameters' float32 values, concatenated in spec order) and grads.bin (the recorded
// gradients, steps x the same layout). The driver builds an Arena of those parameters on
// the chosen backend (cuda: the emulated device in optim_driver_emu), runs train::Optimizer
// with the trainer's hyperparameters for --optimizer (trainer_setup.cpp's set_optim_config
// values), one step per recorded gradient, and writes DIR/out.bin: the parameters after
// every step, steps x the same layout.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/arena.h"
#include "resnet_ddp/train/optimizer.h"

namespace {

std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  RD_CHECK(in, "optim_driver: cannot read " << path);
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<float> v(bytes / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

rd::io::OptimizerKind optimizer_kind(const std::string& name) {
  for (const auto& [n, k] : rd::io::optimizer_names())
    if (n == name) return k;
  RD_FAIL("optim_driver: unknown optimizer " << name);
}

struct Args {
  std::string dir, device = "cpu";
  rd::io::OptimizerConfig cfg;
  double clip = 0.0;
};

Args parse(int argc, char** argv) {
  Args a;
  RD_CHECK(argc >= 2, "usage: optim_driver DIR --device cpu|cuda --optimizer NAME --lr X ...");
  a.dir = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--nesterov") {
      a.cfg.nesterov = true;
      continue;
    }
    RD_CHECK(i + 1 < argc, "optim_driver: " << f << " needs a value");
    const std::string v = argv[++i];
    if (f == "--device") a.device = v;
    else if (f == "--optimizer") a.cfg.type = optimizer_kind(v);
    else if (f == "--lr") a.cfg.lr = std::stod(v);
    else if (f == "--weight-decay") a.cfg.weight_decay = std::stod(v);
    else if (f == "--norm-weight-decay") a.cfg.norm_weight_decay = std::stod(v);
    else if (f == "--bias-weight-decay") a.cfg.bias_weight_decay = std::stod(v);
    else if (f == "--momentum") a.cfg.momentum = std::stod(v);
    else if (f == "--clip-grad-norm") a.clip = std::stod(v);
    else RD_FAIL("optim_driver: unknown flag " << f);
  }
  // The trainer's per-optimizer constants (src/train/trainer_setup.cpp).
  using K = rd::io::OptimizerKind;
  if (a.cfg.type == K::RmsProp) a.cfg.eps = 0.0316, a.cfg.alpha = 0.9;
  if (a.cfg.type == K::Lamb) a.cfg.eps = 1e-6, a.cfg.max_grad_norm = 1.0;
  if (a.cfg.type == K::Adam || a.cfg.type == K::AdamW || a.cfg.type == K::Lamb) a.cfg.momentum = 0.0;
  return a;
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::unique_ptr<rd::Backend> be = a.device == "cuda" ? rd::make_cuda_backend({}) : rd::make_cpu_backend({});
  rd::Arena params, grads;
  std::ifstream spec(a.dir + "/spec.txt");
  RD_CHECK(spec, "optim_driver: cannot read " << a.dir << "/spec.txt");
  for (std::string line; std::getline(spec, line);) {
    std::istringstream ls(line);
    std::string name;
    std::vector<int64_t> dims;
    ls >> name;
    for (int64_t d; ls >> d;) dims.push_back(d);
    params.add(name, rd::Shape::from(dims));
    grads.add(name, rd::Shape::from(dims));
  }
  params.allocate(*be);
  grads.allocate(*be);
  const std::vector<float> init = read_floats(a.dir + "/init.bin"), g = read_floats(a.dir + "/grads.bin");
  size_t total = 0;
  for (const rd::ParamSlice& s : params.slices()) total += s.count;
  RD_CHECK(init.size() == total && total > 0 && g.size() % total == 0, "optim_driver: sizes do not match spec.txt");
  const auto load = [&](rd::Arena& arena, const float* src) {
    for (size_t i = 0; i < arena.slices().size(); ++i, src += arena.slice(i - 1).count)
      be->copy_from_host(arena.ptr(i), src, arena.slice(i).count * sizeof(float));
  };
  load(params, init.data());
  rd::train::Optimizer opt(*be, params, grads, a.cfg);
  opt.set_clip_grad_norm(a.clip);
  std::vector<float> out(g.size());
  for (size_t step = 0; step * total < g.size(); ++step) {
    load(grads, g.data() + step * total);
    opt.step();
    float* dst = out.data() + step * total;
    for (size_t i = 0; i < params.slices().size(); dst += params.slice(i).count, ++i)
      be->copy_to_host(dst, params.ptr(i), params.slice(i).count * sizeof(float));
  }
  be->synchronize();
  std::ofstream o(a.dir + "/out.bin", std::ios::binary);
  o.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size() * sizeof(float)));
  RD_CHECK(o, "optim_driver: cannot write " << a.dir << "/out.bin");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_driver: %s\n", e.what());
    return 1;
  }
}
