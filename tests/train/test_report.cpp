// What a run reports: Python-style number formatting and the metrics CSV across a
// resume.
#include <catch2/catch.hpp>
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
