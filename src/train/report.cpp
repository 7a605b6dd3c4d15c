#include <cstdio>
#include "resnet_ddp/train/report.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "resnet_ddp/dist/launcher.h"
#include "resnet_ddp/errors.h"

namespace rd::train {

std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out as Python's repr.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  if (decpt > -4 && decpt <= 16) {
    std::string out;
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  const int ex = decpt - 1;
  char exbuf[16];
  std::snprintf(exbuf, sizeof exbuf, "e%c%02d", ex < 0 ? '-' : '+', std::abs(ex));
  return sign + mant + exbuf;
}

// ---- signals ---------------------------------------------------------------------

namespace {
volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_count = 0;

// set_stop_notice's text in two slots: the handler reads the published one while the
// trainer fills the other (a step apart, so a handler's write is long done before its
// slot is reused).
constexpr size_t kNoticeBytes = 2048;
char g_notice[2][kNoticeBytes];
size_t g_notice_size[2];
bool g_notice_newline[2];
std::atomic<int> g_notice_slot{-1};  // -1: nothing to print
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

// Async-signal-safe: copies and one write(2).
void write_stop_notice(int sig) {
  const int slot = g_notice_slot.load();
  if (slot < 0) return;
  char line[kNoticeBytes + 64];
  size_t n = 0;
  const auto put = [&](const char* s, size_t len) {
    for (size_t i = 0; i < len && n < sizeof line; ++i) line[n++] = s[i];
  };
  if (g_notice_newline[slot]) put("\n", 1);
  put("resnet_ddp: got ", 16);
  const char* name = signal_name(sig);
  put(name, std::strlen(name));
  put(" ", 1);
  put(g_notice[slot], g_notice_size[slot]);
  ssize_t ignored = ::write(2, line, n);
  (void)ignored;
}

void on_signal(int sig) {
  g_count = g_count + 1;
  if (g_count >= 2) {
    static const char msg[] = "resnet_ddp: second signal received, exiting immediately\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
  g_signal = sig;
  write_stop_notice(sig);
}
}  // namespace

void set_stop_notice(const std::string& text, bool newline_first) {
  if (text.empty()) {
    g_notice_slot.store(-1);
    return;
  }
  const int slot = g_notice_slot.load() == 0 ? 1 : 0;
  const std::string line = text.substr(0, kNoticeBytes - 1) + "\n";
  std::memcpy(g_notice[slot], line.data(), line.size());
  g_notice_size[slot] = line.size();
  g_notice_newline[slot] = newline_first;
  g_notice_slot.store(slot);
}

void install_preemption_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads/MPI polls continue; the loop checks the flag
  // SIGHUP too: mpirun closes the pseudo-terminals it gave the ranks while it ends a job,
  // and a hangup must stop the run as the other signals do, not kill it unsaved.
  for (int sig : {SIGTERM, SIGUSR1, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  // A file-size limit must fail the write (reported, previous checkpoint kept),
  // not kill the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // Nor a closed output pipe: mpirun closes the ranks' output while it terminates a job,
  // and the step must still finish and save (write_out sees EPIPE and goes on).
  std::signal(SIGPIPE, SIG_IGN);
}

int preemption_signal() { return g_signal; }

namespace {
// A second, non-blocking open file description of the pipe or terminal behind `fd`
// (through /proc/self/fd), opened once: a line then goes out in one write whenever there
// is room for it, so mpirun never forwards half a line with the other stream's text in
// the middle, and a stalled reader never blocks the step. O_NONBLOCK is set on this
// description only, not on the one shared with mpirun or the shell. -1 for regular files
// (they never block, and a second description would not append) and where the reopen
// fails (sockets).
int nonblocking_twin(int fd) {
  struct Twin {
    int fd = -1;  // -1: none (a regular file, or the reopen failed)
    dev_t dev = 0;
    ino_t ino = 0;
    bool known = false;
  };
  static std::mutex mutex;
  static std::map<int, Twin> twins;
  std::lock_guard<std::mutex> lock(mutex);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -1;
  Twin& t = twins[fd];
  // Still the same pipe or terminal (the descriptor may have been closed and reused)?
  if (t.known && t.dev == st.st_dev && t.ino == st.st_ino) return t.fd;
  if (t.fd >= 0) ::close(t.fd);
  t = Twin{-1, st.st_dev, st.st_ino, true};
  if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    t.fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  }
  return t.fd;
}
}  // namespace

void write_out(std::FILE* f, const std::string& text) {
  std::fflush(f);
  const int fd = ::fileno(f);
  const int twin = nonblocking_twin(fd);
  size_t done = 0;
  while (done < text.size()) {
    if (twin >= 0) {
      const ssize_t w = ::write(twin, text.data() + done, text.size() - done);
      if (w > 0) {
        done += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EINTR) return;
    }
    pollfd p{twin >= 0 ? twin : fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, 200);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) {
      if (preemption_signal() != 0) return;  // the reader is gone or stalled: the stop comes first
      continue;
    }
    if (p.revents & (POLLERR | POLLNVAL)) return;
    if (twin >= 0) continue;  // room again: the rest in one write
    // Without a twin, POLLOUT promises room for some bytes, not for any write: PIPE_BUF
    // on a pipe, one byte on a terminal; a regular file never blocks.
    struct stat st {};
    const size_t chunk = ::fstat(fd, &st) != 0 ? 1 : S_ISREG(st.st_mode) ? text.size() : S_ISFIFO(st.st_mode) ? 512 : 1;
    const size_t n = std::min(text.size() - done, chunk);
    const ssize_t w = ::write(fd, text.data() + done, n);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;
    }
    done += static_cast<size_t>(w);
  }
}
void reset_preemption() {
  g_signal = 0;
  g_count = 0;
}

// ---- metrics CSV ---------------------------------------------------------------------

std::vector<EpochMetrics::Column> EpochMetrics::columns() const {
  return {{"epoch", static_cast<double>(epoch), true},
          {"time_s", time_s, false},
          {"train_loss", train_loss, false},
          {"train_acc", train_acc, false},
          {"val_loss", val_loss, false},
          {"val_acc", val_acc, false},
          {"best_val_acc", best_val_acc, false},
          {"lr", lr, false},
          {"images_per_s", images_per_s, false},
          {"images_per_s_per_rank", images_per_s_per_rank, false},
          {"data_ms", data_ms, false},
          {"forward_ms", forward_ms, false},
          {"backward_ms", backward_ms, false},
          {"comm_ms", comm_ms, false},
          {"optimizer_ms", optimizer_ms, false},
          {"world_size", static_cast<double>(world_size), true},
          {"global_step", static_cast<double>(global_step), true},
          {"val_acc5", val_acc5, false},
          {"ema_val_loss", ema_val_loss, false},
          {"ema_val_acc", ema_val_acc, false},
          {"ema_val_acc5", ema_val_acc5, false}};
}

const char* MetricsCsv::header() {
  static const std::string line = [] {
    std::string s;
    for (const auto& c : EpochMetrics{}.columns()) {
      if (!s.empty()) s += ',';
      s += c.name;
    }
    return s;
  }();
  return line.c_str();
}

std::string torchvision_accuracy_line(const std::string& log_suffix, double acc1, double acc5) {
  char buf[128];
  std::snprintf(buf, sizeof buf, " Acc@1 %.3f Acc@5 %.3f", 100.0 * acc1, 100.0 * acc5);
  return "Test: " + log_suffix + buf;
}

std::string ema_accuracy_line(double acc1, double acc5, double val_loss) {
  return torchvision_accuracy_line("EMA", acc1, acc5) + " (val loss " + py_float(val_loss) + ")";
}

std::vector<std::string> epoch_summary(const std::string& tag, const EpochMetrics& m, double step_ms) {
  std::vector<std::string> lines;
  lines.push_back(tag + " Time: " + std::to_string(static_cast<long long>(m.time_s)) + "s");
  lines.push_back(tag + " Average train loss: " + py_float(m.train_loss) +
                  ", Average train accuracy: " + py_float(m.train_acc));
  lines.push_back(tag + " Val loss: " + py_float(m.val_loss) + ", Val accuracy: " + py_float(m.val_acc));
  lines.push_back(torchvision_accuracy_line("", m.val_acc, m.val_acc5));
  if (!std::isnan(m.ema_val_acc))  // --model-ema: the reference's second evaluate()
    lines.push_back(tag + " " + ema_accuracy_line(m.ema_val_acc, m.ema_val_acc5, m.ema_val_loss));
  lines.push_back(tag + " Current best val acc: " + py_float(m.best_val_acc));
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s Throughput: %.1f img/s total, %.1f img/s per rank (%lld ranks)", tag.c_str(),
                m.images_per_s, m.images_per_s_per_rank, static_cast<long long>(m.world_size));
  lines.push_back(buf);
  std::snprintf(buf, sizeof buf,
                "%s Step time: %.1f ms = data wait %.1f + forward %.1f + backward %.1f + exposed comm %.1f + "
                "optimizer %.1f ms",
                tag.c_str(), step_ms, m.data_ms, m.forward_ms, m.backward_ms, m.comm_ms, m.optimizer_ms);
  lines.push_back(buf);
  return lines;
}

MetricsCsv::MetricsCsv(const std::string& path, bool append, int64_t first_epoch) : path_(path) {
  std::vector<std::string> keep;
  if (append) {
    std::ifstream in(path);
    std::string line;
    bool first = true;
    std::string missing;  // rows of an older file lack the columns added since: nan
    while (std::getline(in, line)) {
      if (first) {
        first = false;
        const std::string now = header();
        if (line != now && now.rfind(line + ",", 0) == 0)
          for (size_t i = line.size(); i < now.size(); ++i) missing += now[i] == ',' ? ",nan" : "";
        if (line.rfind("epoch,", 0) == 0) continue;
      }
      if (line.empty()) continue;
      const int64_t e = std::atoll(line.c_str());
      if (e >= 1 && e < first_epoch) keep.push_back(line + missing);
    }
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw Error("--metrics: cannot write '" + path + "': " + std::strerror(errno));
  out << header() << "\n";
  for (const auto& l : keep) out << l << "\n";
  if (!out.flush()) throw Error("--metrics: cannot write '" + path + "': " + std::strerror(errno));
}

void MetricsCsv::write(const EpochMetrics& m) {
  std::ofstream out(path_, std::ios::app);
  const char* sep = "";
  for (const auto& c : m.columns()) {
    out << sep;
    if (c.integer) out << static_cast<int64_t>(c.value);
    else out << py_float(c.value);
    sep = ",";
  }
  out << "\n";
  if (!out.flush()) throw Error("--metrics: cannot append to '" + path_ + "': " + std::strerror(errno));
}

// ---- progress --------------------------------------------------------------------------

Progress::Progress(ProgressMode mode, int64_t every) : every_(every) {
  if (mode == ProgressMode::Bar) mode_ = Mode::Bar;
  else if (mode == ProgressMode::Lines) mode_ = Mode::Lines;
  else if (mode == ProgressMode::None) mode_ = Mode::None;
  else {
    // Open MPI hands every rank a pseudo-terminal even when mpirun's own output goes
    // to a file, so under a launcher only --progress bar asks for the bar.
    mode_ = ::isatty(1) && !dist::under_launcher() ? Mode::Bar : Mode::Lines;
  }
  if (mode_ == Mode::Lines && every_ <= 0) mode_ = Mode::None;
}

std::string clock_text(double seconds) {
  const long long t = seconds > 0 && std::isfinite(seconds) ? static_cast<long long>(seconds) : 0;
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

std::string elapsed_eta(double elapsed_s, int64_t done, int64_t left) {
  const std::string remaining =
      done > 0 ? clock_text(elapsed_s / static_cast<double>(done) * static_cast<double>(std::max<int64_t>(left, 0)))
               : "?";
  return clock_text(elapsed_s) + "<" + remaining;
}

void Progress::start_epoch(int64_t epoch, int64_t epochs, int64_t total_steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  total_ = total_steps;
  drawn_ = false;
  epoch_start_ = std::chrono::steady_clock::now();
  first_step_ = -1;
}

void Progress::step(int64_t step, double avg_loss, double avg_acc, double images_per_s) {
  if (mode_ == Mode::None) return;
  const auto now = std::chrono::steady_clock::now();
  // The clock started before the first step reported here: that step is timed too.
  if (first_step_ < 0) first_step_ = step - 1;
  auto timing = [&] {
    return elapsed_eta(std::chrono::duration<double>(now - epoch_start_).count(), step - first_step_, total_ - step);
  };
  char line[320];
  if (mode_ == Mode::Lines) {
    if (step % every_ != 0 && step != total_) return;
    std::snprintf(line, sizeof line, "(Epoch %lld/%lld) step %lld/%lld loss %.4f acc %.4f %.1f img/s %s\n",
                  static_cast<long long>(epoch_), static_cast<long long>(epochs_), static_cast<long long>(step),
                  static_cast<long long>(total_), avg_loss, avg_acc, images_per_s, timing().c_str());
    write_out(stdout, line);
    return;
  }
  // Redraw at most 10 times a second, and always at the end.
  if (drawn_ && step != total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const int width = 30;
  const double frac = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(width - filled), '.');
  std::snprintf(line, sizeof line, "\r(Epoch %lld/%lld) [%s] %lld/%lld loss %.4f acc %.4f %.1f img/s %s\033[K",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), bar.c_str(),
                static_cast<long long>(step), static_cast<long long>(total_), avg_loss, avg_acc, images_per_s,
                timing().c_str());
  write_out(stdout, line);
}

void Progress::end_epoch() {
  if (mode_ == Mode::Bar && drawn_) {
    write_out(stdout, "\r\033[K");
  }
  drawn_ = false;
}

}  // namespace rd::train
