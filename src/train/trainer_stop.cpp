// What a Ctrl-C or a preemption signal prints the moment it arrives, and the notice when
// a step is too long for Open MPI's kill grace. mpirun answers Ctrl-C (or a SIGTERM to
// it) with SIGTERM to the ranks odls_base_sigkill_timeout seconds later (default 1) and
// SIGKILL as long after that, and prints nothing meanwhile: a rank whose step outlasts
// the grace dies before it saves. So the signal handler's line says at once where the
// run stood, what a kill before the save loses, and where the same command resumes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "train/trainer.h"

namespace fs = std::filesystem;

namespace rd::train {

namespace {

// Open MPI's grace in seconds when its mpirun started the ranks; 0 otherwise (a single
// process, or srun: Slurm's KillWait is 30 s by default).
int open_mpi_kill_grace(int world) {
  if (world <= 1 || !std::getenv("OMPI_COMM_WORLD_SIZE")) return 0;
  const char* set = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  return std::max(set && *set ? std::atoi(set) : 1, 1);
}

// A grace in which a step of `step_s` seconds ends and last.h5 is written: three steps,
// rounded up to tens of seconds.
int grace_for(double step_s) {
  const int need = static_cast<int>(std::ceil(3 * step_s));
  return std::max(10, (need + 9) / 10 * 10);
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

}  // namespace

// A quarter of the time between the stop signal and the kill: Open MPI's grace under
// mpirun, Slurm's default KillWait (30 s) otherwise; the rest is for the step that runs
// when the ranks agree, and the save.
double Trainer::stop_latency_budget_s() const {
  const int grace = open_mpi_kill_grace(env_.world);
  return (grace > 0 ? grace : 30) / 4.0;
}

// `position`: "epoch 3 step 8 of 16"; `action`: what the ranks do before they stop.
// Empty: the handler prints nothing (training is over).
void Trainer::stop_notice_at(const std::string& position, const std::string& action) {
  if (!rank0()) return;
  stop_position_ = position;
  stop_action_ = action;
  if (position.empty()) {
    set_stop_notice("");
    return;
  }
  std::string text = "at " + position + "; " + action;
  const int grace = open_mpi_kill_grace(env_.world);
  if (grace == 0) {
    text += " (a second signal ends it at once: the work since the last checkpoint is lost and " + resume_text_ + ")";
  } else {
    text += ". Open MPI kills the ranks " + std::to_string(grace) + " s after its SIGTERM" +
            (step_seconds_ > 0 ? " (a step takes " + seconds_text(step_seconds_) + ")" : "") +
            "; if that comes first, the work since the last checkpoint is lost and " + resume_text_;
    if (step_seconds_ == 0 || step_seconds_ > grace / 2.0)
      text += ". To give a long step time: export OMPI_MCA_odls_base_sigkill_timeout=" +
              std::to_string(grace_for(step_seconds_)) + " before mpirun";
  }
  set_stop_notice(text, progress_ && progress_->mode() == Progress::Mode::Bar);
}

// `path` (last.h5, or the checkpoint this run resumed from) holds `epochs_done` epochs
// and `step_in_epoch` steps of the next one.
// Its resume sentence is composed here, once a save, not at every step.
void Trainer::checkpoint_saved(const std::string& path, int64_t epochs_done, int64_t step_in_epoch) {
  const std::string at = "epoch " + std::to_string(epochs_done + 1) +
                         (step_in_epoch > 0 ? " step " + std::to_string(step_in_epoch) : std::string());
  const std::string from = fs::absolute(path).string();
  const bool same_command_finds_it = o_.resume == ResumeMode::Auto ? path == last_path_
                                     : o_.resume == ResumeMode::File ? path == o_.resume_file
                                                                     : false;
  resume_text_ = same_command_finds_it ? "the same command resumes from " + from + " at " + at
                                       : "the same command with --resume " + from + " resumes at " + at;
  if (!stop_position_.empty()) stop_notice_at(stop_position_, stop_action_);
}

// The run's second step (the first is warm-up) sets the step time the stop line quotes;
// a step longer than half of Open MPI's grace leaves no time to save: say so now, not
// after a Ctrl-C.
void Trainer::measured_step(double seconds) {
  if (++steps_this_run_ != 2) return;
  step_seconds_ = seconds;
  const int grace = open_mpi_kill_grace(env_.world);
  if (grace > 0 && seconds > grace / 2.0)
    say(std::string(progress_ && progress_->mode() == Progress::Mode::Bar ? "\n" : "") + "Notice: a step takes " +
           seconds_text(seconds) + ", and after a Ctrl-C or a SIGTERM to mpirun Open MPI gives the ranks " +
           std::to_string(grace) +
           " s between its SIGTERM and SIGKILL: too little to end the step and save last.h5, so a stop loses "
           "the work since the last checkpoint. export OMPI_MCA_odls_base_sigkill_timeout=" +
           std::to_string(grace_for(seconds)) + " before mpirun, and a stop saves the step instead");
}

}  // namespace rd::train
