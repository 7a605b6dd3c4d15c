// The C++ half of check_sched_vs_torch.py: reads one schedule per stdin line
//   NAME KIND LR EPOCHS STEPS STEP_SIZE GAMMA MILESTONES|- ETA_MIN WARMUP METHOD DECAY RESUME_AT
// and prints "NAME lr_0 lr_1 ... lr_STEPS": the LR the schedule starts with and the LR
// after each of STEPS epoch steps, as %.17g. RESUME_AT > 0: after that many steps the
// state is exported, a new Scheduler built from the same flags imports it and goes on
// (what a resume from last.h5 does, the LR coming back with the optimizer's state).
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "resnet_ddp/train/scheduler.h"

using namespace rd;
using namespace rd::train;

namespace {

template <class E>
E lookup(const NameTable<E>& table, const std::string& name) {
  for (const auto& [n, v] : table)
    if (n == name) return v;
  throw std::runtime_error("sched_driver: unknown name '" + name + "'");
}

void run(std::istringstream& in) {
  std::string name, kind, milestones, method;
  int64_t steps = 0, resume_at = 0;
  SchedulerConfig c;
  in >> name >> kind >> c.base_lr >> c.epochs >> steps >> c.step_size >> c.gamma >> milestones >> c.eta_min >>
      c.warmup_epochs >> method >> c.warmup_decay >> resume_at;
  if (!in) throw std::runtime_error("sched_driver: bad line for " + name);
  c.kind = lookup(scheduler_names(), kind);
  c.warmup_method = lookup(warmup_method_names(), method);
  if (milestones != "-") {
    std::istringstream ms(milestones);
    for (std::string m; std::getline(ms, m, ',');) c.milestones.push_back(std::stoll(m));
  }
  auto sched = std::make_unique<Scheduler>(c);
  double lr = sched->initial_lr();
  std::printf("%s %.17g", name.c_str(), lr);
  for (int64_t k = 1; k <= steps; ++k) {
    lr = sched->step(lr, 0.0);
    std::printf(" %.17g", lr);
    if (k == resume_at) {
      const SchedulerState saved = sched->export_state();
      sched = std::make_unique<Scheduler>(c);
      sched->import_state(saved);
    }
  }
  std::printf("\n");
}

}  // namespace

int main() {
  try {
    for (std::string line; std::getline(std::cin, line);) {
      if (line.empty()) continue;
      std::istringstream in(line);
      run(in);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
