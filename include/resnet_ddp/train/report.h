// Output helpers of the trainer: Python-style number formatting (the reference
// lines print Python floats), preemption signals, the per-epoch metrics CSV and
// the progress display.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "resnet_ddp/io/json.h"
#include "resnet_ddp/train/option_types.h"

namespace rd::train {

// repr() of a Python float: shortest round-trip digits, "1.0" not "1",
// scientific below 1e-4 / from 1e16 ("1e-05", "1.5e+16"), "nan", "inf".
std::string py_float(double x);
using io::json_string;  // resnet_ddp/io/json.h

// ---- preemption signals ------------------------------------------------------------
// SIGTERM, SIGUSR1, SIGINT and SIGHUP: the first sets a flag the training loop polls (every
// rank agrees through a small all-reduce each step); a second one ends the process
// at once with status 128 + signal.
void install_preemption_handlers();
// The signal received so far (0 = none).
int preemption_signal();
// For tests: forget a received signal.
void reset_preemption();
// The line the first stop signal prints at once on stderr (write(2) in the handler):
// "resnet_ddp: got SIGTERM " + `text`, where the run is, what a kill before the next
// checkpoint would lose and how to resume. mpirun's SIGKILL may follow within a second
// (docs/usage.md), so the user must learn that when it happens. Empty: nothing printed.
// `newline_first`: a progress bar holds the terminal's current line.
void set_stop_notice(const std::string& text, bool newline_first = false);
// Writes `text` to `f` (flushed). While the reader does not take it, it waits, as a
// plain write would; but once a stop signal has arrived it drops the text instead, so
// that training reaches the step boundary and saves. mpirun stops reading the ranks'
// output while it terminates a job (Ctrl-C, SIGTERM to it), and a rank blocked in a
// write would never see the stop before mpirun's SIGKILL.
void write_out(std::FILE* f, const std::string& text);

// ---- metrics CSV -----------------------------------------------------------------
struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double time_s = 0;
  double train_loss = 0, train_acc = 0;
  double val_loss = 0, val_acc = 0;
  double val_acc5 = 0;  // top-5 (after the older columns, so those keep their places)
  // --model-ema: the average's validation (nan without it); the last columns.
  double ema_val_loss = std::nan(""), ema_val_acc = std::nan(""), ema_val_acc5 = std::nan("");
  double best_val_acc = 0;
  double lr = 0;
  double images_per_s = 0, images_per_s_per_rank = 0;
  double data_ms = 0, forward_ms = 0, backward_ms = 0, comm_ms = 0, optimizer_ms = 0;
  int64_t world_size = 1;
  int64_t global_step = 0;

  // The fields in metrics.csv's column order: the one list the CSV (header and rows)
  // and the TensorBoard epoch/ scalars are written from.
  struct Column {
    const char* name;
    double value;
    bool integer;  // written without a decimal point
  };
  std::vector<Column> columns() const;
};

// torchvision's reference evaluate() line, "Test: <suffix> Acc@1 76.130 Acc@5 92.862"
// (percentages; the suffix is "" for the model itself, "EMA" for its average).
std::string torchvision_accuracy_line(const std::string& log_suffix, double acc1, double acc5);
// The EMA's line with its validation loss: "Test: EMA Acc@1 ... Acc@5 ... (val loss ...)".
std::string ema_accuracy_line(double acc1, double acc5, double val_loss);

// The lines the trainer prints after an epoch (time, train and validation results, best
// accuracy, throughput, where a step's time went); `step_ms` is the whole step's mean.
std::vector<std::string> epoch_summary(const std::string& tag, const EpochMetrics& m, double step_ms);

class MetricsCsv {
 public:
  // append: keep earlier rows (resume) and drop rows for epochs >= first_epoch
  // (re-run after a preemption); otherwise start a new file.
  MetricsCsv(const std::string& path, bool append, int64_t first_epoch);
  void write(const EpochMetrics& m);
  const std::string& path() const { return path_; }
  static const char* header();

 private:
  std::string path_;
};

// ---- progress --------------------------------------------------------------------
// "M:SS" or "H:MM:SS" (tqdm's clock), whole seconds rounded down.
std::string clock_text(double seconds);
// The epoch's "elapsed<remaining" (tqdm's "0:12<1:05"): `done` steps took `elapsed_s`,
// `left` steps to go at the same pace; "?" for the remainder before a step is timed.
std::string elapsed_eta(double elapsed_s, int64_t done, int64_t left);

// A live bar (TTY) or plain lines every `every` steps, with the epoch's elapsed time
// and ETA; only rank 0 makes one.
class Progress {
 public:
  enum class Mode { Bar, Lines, None };
  // --progress: auto = bar on a terminal, else lines.
  Progress(ProgressMode mode, int64_t every);
  Mode mode() const { return mode_; }
  void start_epoch(int64_t epoch, int64_t epochs, int64_t total_steps);
  // After each optimizer step: running averages and throughput so far.
  void step(int64_t step, double avg_loss, double avg_acc, double images_per_s);
  void end_epoch();

 private:
  Mode mode_;
  int64_t every_;
  int64_t epoch_ = 0, epochs_ = 0, total_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
  std::chrono::steady_clock::time_point epoch_start_{};
  int64_t first_step_ = -1;  // the step count the epoch started from (a resume starts mid-epoch)
  bool drawn_ = false;
};

}  // namespace rd::train
