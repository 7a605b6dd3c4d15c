// resnet_ddp: one program for training (mpirun/srun), prediction, checkpoint
// inspection and dataset tools. Flags are parsed before MPI starts so that a typo
// costs no allocation time and prints one message (rank 0), exit status 2.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/commands.h"
#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/train/cli.h"
#include "resnet_ddp/train/commands.h"

namespace {

int run(int argc, char** argv) {
  using namespace rd::train;
  const bool speaker = rd::dist::launcher_rank() == 0;
  auto usage_error = [&](const std::exception& e) {
    if (speaker) std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  };
  ParsedCommand pc;
  try {
    pc = parse_command_line(argc, argv);
  } catch (const rd::UsageError& e) {
    return usage_error(e);
  }
  switch (pc.command) {
    case Command::Help:
      if (speaker) std::fputs(pc.help_text.c_str(), stdout);
      return 0;
    case Command::Version:
      // The backends line lets a login-node pre-flight see whether GPUs can be used.
      if (speaker)
        std::printf("resnet_ddp %s\nbackends: cpu, cuda %s\n", RESNET_DDP_VERSION,
                    rd::cuda_backend_built() ? "(built)" : "(not built)");
      return 0;
    case Command::Synth:
    case Command::Pack: {
      std::vector<char*> args;
      for (auto& a : pc.passthrough) args.push_back(a.data());
      args.push_back(nullptr);
      const int n = static_cast<int>(pc.passthrough.size());
      return pc.command == Command::Synth ? rd::data::synth_main(n, args.data())
                                          : rd::data::pack_main(n, args.data());
    }
    case Command::Info:
      return info_main(pc.info);
    case Command::Export:
      return export_main(pc.exp);
    case Command::Predict:
      try {
        check_predict_paths(pc.predict);
      } catch (const rd::UsageError& e) {
        return usage_error(e);
      }
      return predict_main(pc.predict);
    case Command::Train:
      if (pc.train.check) return check_main(pc.train);
      try {
        check_train_paths(pc.train, speaker);
      } catch (const rd::UsageError& e) {
        return usage_error(e);
      }
      return train_main(pc.train, argc, argv);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_ddp: error: %s\n", e.what());
    return 1;
  }
}
