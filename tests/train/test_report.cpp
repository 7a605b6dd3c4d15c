// What a run reports: Python-style number formatting and the metrics CSV across a
// resume.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <thread>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "resnet_ddp/train/report.h"
#include "train/train_test_util.h"

namespace fs = std::filesystem;
using namespace rd;
using namespace rd::train;
using rd::test::TempDir;

TEST_CASE("py_float prints like Python's repr", "[train]") {
  CHECK(py_float(0.1) == "0.1");
  CHECK(py_float(1.0) == "1.0");
  CHECK(py_float(100.0) == "100.0");
  CHECK(py_float(0.875) == "0.875");
  CHECK(py_float(-0.3) == "-0.3");
  CHECK(py_float(0.0001) == "0.0001");
  CHECK(py_float(1e-05) == "1e-05");
  CHECK(py_float(1.0000000000000002e-06) == "1.0000000000000002e-06");
  CHECK(py_float(1e16) == "1e+16");
  CHECK(py_float(1234567890123456.0) == "1234567890123456.0");
  CHECK(py_float(static_cast<double>(0.5654761791229248f)) == "0.5654761791229248");
  CHECK(py_float(2.0 / 3.0) == "0.6666666666666666");
  CHECK(py_float(0.0) == "0.0");
  CHECK(py_float(NAN) == "nan");
}

TEST_CASE("metrics CSV keeps earlier epochs on resume", "[train]") {
  TempDir dir;
  const std::string p = dir.file("metrics.csv");
  {
    MetricsCsv csv(p, false, 1);
    for (int e = 1; e <= 3; ++e) {
      EpochMetrics m;
      m.epoch = e;
      m.val_acc = 0.5;
      csv.write(m);
    }
  }
  MetricsCsv resumed(p, true, 3);  // epoch 3 is re-run after a preemption
  EpochMetrics m;
  m.epoch = 3;
  resumed.write(m);
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == MetricsCsv::header());
  CHECK(lines[1].rfind("1,", 0) == 0);
  CHECK(lines[2].rfind("2,", 0) == 0);
  CHECK(lines[3].rfind("3,", 0) == 0);
}

TEST_CASE("metrics CSV: val_acc5 and the EMA's columns come last, an older file's rows get nan for them on resume",
          "[train]") {
  const std::string header = MetricsCsv::header();
  CHECK(header.rfind("epoch,time_s,train_loss,train_acc,val_loss,val_acc,best_val_acc,", 0) == 0);
  const std::string tail = ",global_step,val_acc5,ema_val_loss,ema_val_acc,ema_val_acc5";
  REQUIRE(header.size() > tail.size());
  CHECK(header.substr(header.size() - tail.size()) == tail);
  TempDir dir;
  const std::string p = dir.file("metrics.csv");
  {
    MetricsCsv csv(p, false, 1);
    EpochMetrics m;
    m.epoch = 1;
    m.val_acc = 0.5;
    m.val_acc5 = 0.875;
    csv.write(m);
  }
  std::vector<std::string> lines;
  {
    std::ifstream in(p);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].substr(lines[1].size() - 18) == ",0.875,nan,nan,nan");  // no EMA: nan
  // A metrics.csv written before val_acc5 existed: same columns less the last.
  const std::string old_header = header.substr(0, header.size() - (tail.size() - std::string(",global_step").size()));
  {
    std::ofstream out(p, std::ios::trunc);
    out << old_header << "\n1,10.0,1.0,0.5,1.0,0.5,0.5,0.1,1.0,1.0,1.0,1.0,1.0,1.0,1.0,1,5\n";
  }
  MetricsCsv resumed(p, true, 2);
  lines.clear();
  std::ifstream in(p);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == header);
  CHECK(lines[1] == "1,10.0,1.0,0.5,1.0,0.5,0.5,0.1,1.0,1.0,1.0,1.0,1.0,1.0,1.0,1,5,nan,nan,nan,nan");
}

TEST_CASE("the validation summary has torchvision's Acc@1/Acc@5 line", "[train]") {
  CHECK(torchvision_accuracy_line("", 0.7613, 0.92862) == "Test:  Acc@1 76.130 Acc@5 92.862");
  CHECK(torchvision_accuracy_line("EMA", 1.0, 1.0) == "Test: EMA Acc@1 100.000 Acc@5 100.000");
  EpochMetrics m;
  m.val_loss = 1.0;
  m.val_acc = 0.5;
  m.val_acc5 = 0.75;
  const auto lines = epoch_summary("(Epoch 1/1)", m, 1.0);
  // After the tutorial's own validation line, which stays as it was.
  const auto val = std::find(lines.begin(), lines.end(), "(Epoch 1/1) Val loss: 1.0, Val accuracy: 0.5");
  REQUIRE(val != lines.end());
  REQUIRE(val + 1 != lines.end());
  CHECK(*(val + 1) == "Test:  Acc@1 50.000 Acc@5 75.000");
  CHECK(std::none_of(lines.begin(), lines.end(), [](const std::string& l) { return l.find("EMA") != l.npos; }));
  // --model-ema: the average's line right after the model's, as the reference prints it.
  m.ema_val_loss = 0.25;
  m.ema_val_acc = 0.625;
  m.ema_val_acc5 = 1.0;
  const auto ema = epoch_summary("(Epoch 1/1)", m, 1.0);
  const auto top = std::find(ema.begin(), ema.end(), "Test:  Acc@1 50.000 Acc@5 75.000");
  REQUIRE(top != ema.end());
  REQUIRE(top + 1 != ema.end());
  CHECK(*(top + 1) == "(Epoch 1/1) Test: EMA Acc@1 62.500 Acc@5 100.000 (val loss 0.25)");
}

TEST_CASE("progress: elapsed time and ETA as tqdm's clock", "[train]") {
  CHECK(clock_text(0) == "0:00");
  CHECK(clock_text(59.9) == "0:59");
  CHECK(clock_text(61) == "1:01");
  CHECK(clock_text(3725) == "1:02:05");
  CHECK(clock_text(-1) == "0:00");
  // 10 steps in 12 s, 50 to go at 1.2 s each: 60 s.
  CHECK(elapsed_eta(12.0, 10, 50) == "0:12<1:00");
  CHECK(elapsed_eta(0.5, 0, 50) == "0:00<?");  // nothing timed yet
  CHECK(elapsed_eta(30.0, 60, 0) == "0:30<0:00");
}

// write_out goes through a non-blocking second description of a pipe: a slow reader gets
// every byte in order (partial writes resumed), and a reader that never reads does not
// block the writer once a stop signal arrived.
// A line under PIPE_BUF goes out in one write: a reader already waiting gets it whole in
// its first read (512-byte pieces let mpirun put the other stream's text inside a line).
TEST_CASE("write_out: a 3000-byte line reaches a waiting pipe reader in one piece", "[train]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::FILE* out = ::fdopen(fds[1], "w");
  REQUIRE(out);
  const std::string line = std::string(2999, 'r') + "\n";
  ssize_t first = 0;
  std::thread reader([&] {
    char buf[8192];
    first = ::read(fds[0], buf, sizeof buf);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the reader waits in read()
  write_out(out, line);
  reader.join();
  CHECK(first == static_cast<ssize_t>(line.size()));
  std::fclose(out);
  ::close(fds[0]);
}

TEST_CASE("write_out: every byte through a slow pipe, and no hang on a stalled one after a stop signal", "[train]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::FILE* out = ::fdopen(fds[1], "w");
  REQUIRE(out);
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "line " + std::to_string(i) + "\n";  // ~200 KB: over the pipe's 64 KB
  std::string got;
  std::thread reader([&] {
    char buf[4096];
    for (;;) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
      if (got.size() >= text.size()) break;
    }
  });
  write_out(out, text);
  reader.join();
  CHECK(got == text);

  // Stalled: fill the pipe (through a non-blocking description of its own), then a stop
  // signal 0.3 s into the write.
  const std::string path = "/proc/self/fd/" + std::to_string(fds[1]);
  const int fill = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
  REQUIRE(fill >= 0);
  const std::string block(4096, 'x');
  while (::write(fill, block.data(), block.size()) > 0) {
  }
  install_preemption_handlers();
  std::thread stopper([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::raise(SIGUSR1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  write_out(out, "this line has nowhere to go\n");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stopper.join();
  CHECK(preemption_signal() == SIGUSR1);
  CHECK(waited < 5.0);  // returned after the signal (a 200 ms poll), not blocked on the full pipe
  reset_preemption();
  std::signal(SIGUSR1, SIG_DFL);
  ::close(fill);
  std::fclose(out);
  ::close(fds[0]);
}
