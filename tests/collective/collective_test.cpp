// Every Comm operation on sizes 0, 1, 7 and 2^20+3, compared with the exact
// expected values (inputs are small integers, so float sums are exact). Runs
// under mpirun with 2, 3 and 4 ranks; CHECK (not REQUIRE) keeps every rank on
// the same sequence of collectives even when one check fails.
#include <algorithm>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/dist/ddp.h"
#include "resnet_ddp/errors.h"

using rd::dist::Comm;
using rd::dist::ReduceOp;

namespace {

const size_t kSizes[] = {0, 1, 7, (size_t{1} << 20) + 3};

Comm& world() {
  static std::unique_ptr<Comm> comm = rd::dist::make_mpi_comm();
  return *comm;
}

// Rank r contributes (r + 1) + (i % 7); the sum over n ranks is exact.
template <class T> std::vector<T> contribution(int rank, size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(rank + 1 + static_cast<int>(i % 7));
  return v;
}
template <class T> T expected_sum(int world_size, size_t i) {
  return static_cast<T>(world_size * (world_size + 1) / 2 + world_size * static_cast<int>(i % 7));
}

// Counts mismatches instead of one CHECK per element (a million elements).
template <class T> size_t mismatches(const std::vector<T>& got, ReduceOp op, int world_size) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    T want = expected_sum<T>(world_size, i);
    if (op == ReduceOp::Average) want = want / static_cast<T>(world_size);
    if (got[i] != want) ++bad;
  }
  return bad;
}

template <class T> void check_allreduce(ReduceOp op) {
  Comm& c = world();
  for (size_t n : kSizes) {
    auto v = contribution<T>(c.rank(), n);
    c.allreduce(v.data(), n, op);
    INFO("n=" << n << " op=" << rd::dist::reduce_op_name(op) << " ranks=" << c.size());
    CHECK(mismatches(v, op, c.size()) == 0);
  }
}

}  // namespace

TEST_CASE("allreduce float/double/int64, sum and average", "[collective]") {
  check_allreduce<float>(ReduceOp::Sum);
  check_allreduce<float>(ReduceOp::Average);
  check_allreduce<double>(ReduceOp::Sum);
  check_allreduce<double>(ReduceOp::Average);
  check_allreduce<int64_t>(ReduceOp::Sum);
  // Integer average truncates toward zero, like C++ division.
  check_allreduce<int64_t>(ReduceOp::Average);
}

TEST_CASE("iallreduce completes while the caller computes", "[collective]") {
  Comm& c = world();
  for (size_t n : kSizes) {
    auto v = contribution<float>(c.rank(), n);
    auto req = c.iallreduce(v.data(), n, ReduceOp::Average);
    // Work between progress calls, as backward does between layers.
    double sink = 0;
    bool done = false;
    for (int step = 0; step < 2000 && !done; ++step) {
      for (int k = 0; k < 2000; ++k) sink += std::sqrt(static_cast<double>(k + step));
      c.progress();
      done = req->test();
    }
    req->wait();
    CHECK(sink > 0);
    INFO("n=" << n);
    CHECK(mismatches(v, ReduceOp::Average, c.size()) == 0);
  }
}

TEST_CASE("several iallreduces in flight, waited in reverse order", "[collective]") {
  Comm& c = world();
  std::vector<std::vector<float>> bufs;
  std::vector<std::unique_ptr<rd::dist::Request>> reqs;
  for (size_t n : kSizes) bufs.push_back(contribution<float>(c.rank(), n));
  for (auto& b : bufs) reqs.push_back(c.iallreduce(b.data(), b.size(), ReduceOp::Sum));
  for (size_t i = reqs.size(); i-- > 0;) reqs[i]->wait();
  for (auto& b : bufs) CHECK(mismatches(b, ReduceOp::Sum, c.size()) == 0);
  // A finished request stays finished.
  CHECK(reqs[0]->test());
}

TEST_CASE("allreduce of non-integer values is bit-identical on every rank", "[collective]") {
  Comm& c = world();
  std::mt19937 gen(1234 + c.rank());
  std::normal_distribution<float> dist;
  std::vector<float> v((1 << 16) + 5);
  for (float& x : v) x = dist(gen);
  c.allreduce(v.data(), v.size(), ReduceOp::Average);
  uint64_t h = rd::dist::checksum_bytes(v.data(), v.size() * sizeof(float));
  std::vector<uint64_t> all(static_cast<size_t>(c.size()));
  c.allgather(&h, all.data(), sizeof h);
  for (uint64_t x : all) CHECK(x == all[0]);
  // Chained over 8-byte-multiple pieces (how device arenas are hashed), the same hash.
  const size_t bytes = v.size() * sizeof(float), cut = 4096 * 8;
  CHECK(rd::dist::checksum_bytes(reinterpret_cast<const char*>(v.data()) + cut, bytes - cut,
                                 rd::dist::checksum_bytes(v.data(), cut)) == h);
}

TEST_CASE("broadcast from every root", "[collective]") {
  Comm& c = world();
  for (size_t n : kSizes) {
    for (int root = 0; root < c.size(); ++root) {
      std::vector<unsigned char> buf(n, 0xEE);
      if (c.rank() == root)
        for (size_t i = 0; i < n; ++i) buf[i] = static_cast<unsigned char>((root * 31 + i) & 0xff);
      c.broadcast(buf.data(), n, root);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += buf[i] != static_cast<unsigned char>((root * 31 + i) & 0xff);
      INFO("n=" << n << " root=" << root);
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("send/recv: rank 0 to every rank and back", "[collective]") {
  Comm& c = world();
  for (size_t n : kSizes) {
    const size_t bytes = n * sizeof(float);
    if (c.rank() == 0) {
      for (int peer = 1; peer < c.size(); ++peer) {
        auto v = contribution<float>(peer, n);
        c.send(v.data(), bytes, peer, 7);
      }
      for (int peer = 1; peer < c.size(); ++peer) {
        std::vector<float> back(n, -1.f);
        c.recv(back.data(), bytes, peer, 8);
        auto want = contribution<float>(peer, n);
        for (float& x : want) x *= 2;
        INFO("reply from " << peer << " n=" << n);
        CHECK(back == want);
      }
    } else {
      std::vector<float> v(n, -1.f);
      c.recv(v.data(), bytes, 0, 7);
      INFO("rank " << c.rank() << " n=" << n);
      CHECK(v == contribution<float>(c.rank(), n));
      for (float& x : v) x *= 2;
      c.send(v.data(), bytes, 0, 8);
    }
  }
}

TEST_CASE("allgather places rank r's block at r", "[collective]") {
  Comm& c = world();
  for (size_t n : kSizes) {
    auto mine = contribution<float>(c.rank(), n);
    std::vector<float> all(n * static_cast<size_t>(c.size()), -1.f);
    c.allgather(mine.data(), all.data(), n * sizeof(float));
    size_t bad = 0;
    for (int r = 0; r < c.size(); ++r) {
      auto want = contribution<float>(r, n);
      // std::equal, not memcmp: for n == 0 the vectors' data() may be null (UB in memcmp).
      bad += !std::equal(want.begin(), want.end(), all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * n));
    }
    INFO("n=" << n);
    CHECK(bad == 0);
  }
}

TEST_CASE("barrier holds every rank until the last one arrives", "[collective]") {
  Comm& c = world();
  c.barrier();  // line up, then rank 0 arrives 200 ms late
  auto t0 = std::chrono::steady_clock::now();
  if (c.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  c.barrier();
  // Generous lower bound: ranks leave the first barrier a little apart.
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited >= 0.1);
}

TEST_CASE("bad peers, roots and tags are clear errors", "[collective]") {
  Comm& c = world();
  float x = 0;
  CHECK_THROWS_WITH(c.send(&x, sizeof x, c.size(), 0), Catch::Contains("not a rank"));
  CHECK_THROWS_WITH(c.recv(&x, sizeof x, -1, 0), Catch::Contains("not a rank"));
  CHECK_THROWS_WITH(c.send(&x, sizeof x, 0, 40000), Catch::Contains("tag"));
  CHECK_THROWS_WITH(c.broadcast(&x, sizeof x, c.size() + 3), Catch::Contains("root"));
  CHECK(c.device() == rd::DeviceKind::CPU);
  CHECK(c.name() == "mpi");
}

TEST_CASE("watchdog options are validated", "[collective]") {
  auto saved = rd::dist::watchdog_options();
  rd::dist::WatchdogOptions bad = saved;
  bad.peer_timeout_s = bad.heartbeat_interval_s;  // must be at least twice
  CHECK_THROWS_AS(rd::dist::set_watchdog_options(bad), rd::UsageError);
  bad = saved;
  bad.collective_timeout_s = 0;
  CHECK_THROWS_AS(rd::dist::set_watchdog_options(bad), rd::UsageError);
  rd::dist::set_watchdog_options(saved);
  CHECK(rd::dist::lost_peer() == -1);
}
