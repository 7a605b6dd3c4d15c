// Fuzz target: the checkpoint reader's own parsing (root attributes and their
// types, class names, state_dict / optimizer / scheduler names and shapes). A
// real resnet_tiny checkpoint (Adam state, plateau scheduler) is written once;
// each input is a list of structural edits (h5_edit.h) applied to a copy, which
// then goes through every read path: CheckpointReader's metadata and
// check_tensors (info, weights-only and full), load_model / load_optimizer
// (--init, --resume, predict). rd::Error is a clean refusal; anything else is a finding.

#include <algorithm>
#include <string>

#include "h5_edit.h"
#include "scratch_dir.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/io/checkpoint.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/scheduler.h"

using namespace rd;

namespace {

struct Fixture {
  fuzz::ScratchDir scratch{"rd_fuzz_ckpt"};  // first: the members below write into it
  const std::string dir = scratch.path;
  std::string seed_path, work_path;
  std::vector<char> seed;
  fuzz::H5Names names;
  std::unique_ptr<Backend> be;
  std::unique_ptr<ResNet> model;
  std::unique_ptr<train::Optimizer> opt;
  std::unique_ptr<train::Scheduler> sched;
  Fixture() {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    be = make_cpu_backend();
    ResNetConfig cfg;
    cfg.arch = "resnet_tiny";
    cfg.num_classes = 3;
    model = std::make_unique<ResNet>(*be, cfg);
    model->init_parameters(1);
    train::OptimizerConfig oc;
    opt = std::make_unique<train::Optimizer>(*be, model->params(), model->grads(), oc);
    sched = std::make_unique<train::Scheduler>(io::SchedulerKind::Plateau, 1e-3, 5);
    io::CheckpointMeta m;
    m.arch = "resnet_tiny";
    m.head = "mlp";
    m.num_classes = 3;
    m.image_size = 32;
    m.world_size = 1;
    m.class_names = {"a", "b", "c"};
    seed_path = dir + "/seed.h5";
    const io::OptimizerState opt_state = opt->export_state();
    const io::SchedulerState sched_state = sched->export_state();
    io::write_checkpoint(seed_path, *model, &opt_state, &sched_state, m);
    seed = fuzz::slurp(seed_path);
    // Without its checksum header the file is parsed in this process (as files from
    // other tools are): the parsing under test. With it, every edit would be refused
    // by the checksum before any parsing.
    std::fill(seed.begin(), seed.begin() + 512, '\0');
    names = fuzz::list_names(seed_path);
    work_path = dir + "/work.h5";
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  FuzzedDataProvider fdp(data, size);
  // One read path per input (each is a full pass over the file): the metadata,
  // info's (weights-only or full), --init's and --resume's / predict's.
  const int path = fdp.ConsumeIntegralInRange(0, 4);
  fuzz::spit(fx.work_path, fx.seed);
  fuzz::apply_edits(fdp, fx.work_path, fx.names);
  const bool weights_only = path == 1 || path == 3;
  try {
    if (path == 0) {
      (void)io::CheckpointReader(fx.work_path, false).meta();
    } else if (path <= 2) {
      (void)io::CheckpointReader(fx.work_path, weights_only).check_tensors();
    } else {
      io::CheckpointReader r(fx.work_path, weights_only);
      io::check_compatible(r.meta(), *fx.model, {"a", "b", "c"}, fx.work_path);
      (void)r.load_model(*fx.model, weights_only);
      if (!weights_only) {
        r.load_optimizer(*fx.model, fx.opt->export_state());
        fx.opt->import_state(r.meta().optimizer);
        fx.sched->import_state(r.meta().scheduler);
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
