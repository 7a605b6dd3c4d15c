// Data component tests: scanning and every bad-input case, sampler semantics,
// loader determinism and shutdown, HDF5 pack round trip, subcommand flags.
#include <stb/stb_image_write.h>

#include <hdf5.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "resnet_ddp/data/commands.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/loader.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/data/sampler.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

namespace fs = std::filesystem;
using namespace rd::data;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/rd_data_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// A deterministic test picture: value depends on position, seed and channel.
std::vector<uint8_t> pattern(int w, int h, int seed) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * 7 + y * 13 + seed * 31 + c * 50 + (x * y) % 17) & 255);
  return px;
}

void write_png(const fs::path& p, int w, int h, int seed) {
  fs::create_directories(p.parent_path());
  const auto px = pattern(w, h, seed);
  REQUIRE(stbi_write_png(p.c_str(), w, h, 3, px.data(), w * 3) != 0);
}

void write_jpg(const fs::path& p, int w, int h, int seed) {
  fs::create_directories(p.parent_path());
  const auto px = pattern(w, h, seed);
  REQUIRE(stbi_write_jpg(p.c_str(), w, h, 3, px.data(), 90) != 0);
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Train + Validation with classes "cat" and "ant" (sorted: ant=0, cat=1).
void make_good_tree(const fs::path& root, int per_class = 3) {
  for (const char* split : {"Train", "Validation"})
    for (const char* cls : {"cat", "ant"})
      for (int i = 0; i < per_class; ++i)
        write_png(root / split / cls / ("img" + std::to_string(i) + ".png"), 20 + i, 16 + 2 * i,
                  i + (cls[0] == 'c' ? 100 : 0));
}

struct Captured {
  std::vector<std::string> lines;
  LogFn fn() {
    return [this](const std::string& l) { lines.push_back(l); };
  }
  bool mentions(const std::string& s) const {
    for (const auto& l : lines)
      if (l.find(s) != std::string::npos) return true;
    return false;
  }
};

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const rd::UsageError& e) {
    return e.what();
  }
  FAIL("expected rd::UsageError");
  return {};
}

}  // namespace

TEST_CASE("ImageFolder scan: classes, labels, order, ignored files", "[data][scan]") {
  TempDir t;
  make_good_tree(t.path);
  write_png(t.path / "Train/cat/nested/deeper.PNG", 12, 12, 7);  // recursive, case-insensitive
  write_bytes(t.path / "Train/cat/notes.txt", "not an image");
  write_bytes(t.path / "Train/README", "loose file");
  Captured log;
  ScanOptions opts;
  opts.log = log.fn();
  auto ds = open_dataset(t.str(), Split::Train, opts);
  REQUIRE(ds->class_names() == std::vector<std::string>{"ant", "cat"});
  REQUIRE(ds->size() == 7);
  CHECK(ds->class_counts() == std::vector<size_t>{3, 4});
  CHECK(ds->label(0) == 0);
  CHECK(ds->source(0).find("ant/img0.png") != std::string::npos);
  // torchvision order: sorted(os.walk()) -> files of cat/ before cat/nested/.
  CHECK(ds->source(3).find("cat/img0.png") != std::string::npos);
  CHECK(ds->source(6).find("cat/nested/deeper.PNG") != std::string::npos);
  CHECK(ds->skipped_files() == 2);  // notes.txt + README ignored
  Image img;
  ds->load(1, img);
  CHECK(img.width == 21);
  CHECK(img.height == 18);
  const auto expect = pattern(21, 18, 1);
  CHECK(std::equal(expect.begin(), expect.end(), img.pixels.begin()));
  CHECK(describe_counts(*ds, Split::Train) == "Train set size: 7\n  ant: 3\n  cat: 4");
  auto val = open_dataset(t.str(), Split::Validation, opts);
  CHECK(val->size() == 6);
  CHECK_FALSE(has_split(t.str(), Split::Test));
}

TEST_CASE("decoding: gray, RGBA and 16-bit inputs become RGB", "[data][scan]") {
  TempDir t;
  const std::vector<uint8_t> gray = {0, 85, 170, 255};
  REQUIRE(stbi_write_png((t.path / "g.png").c_str(), 2, 2, 1, gray.data(), 2));
  const std::vector<uint8_t> rgba = {10, 20, 30, 0, 40, 50, 60, 255};
  REQUIRE(stbi_write_png((t.path / "a.png").c_str(), 2, 1, 4, rgba.data(), 8));
  Image img;
  decode_image_file((t.path / "g.png").string(), img);
  REQUIRE(img.bytes() == 12);
  CHECK(img.pixels[3] == 85);
  CHECK(img.pixels[4] == 85);
  CHECK(img.pixels[5] == 85);
  decode_image_file((t.path / "a.png").string(), img);
  CHECK(img.pixels == std::vector<uint8_t>{10, 20, 30, 40, 50, 60});
  // 16-bit binary PGM, big-endian samples: 0x1234 -> high byte 0x12.
  write_bytes(t.path / "d.pgm", std::string("P5\n1 1\n65535\n\x12\x34", 16));
  decode_image_file((t.path / "d.pgm").string(), img);
  CHECK(img.pixels[0] == 0x12);
}

TEST_CASE("bad input files are skipped with a warning, or fail under --strict-data", "[data][scan]") {
  TempDir t;
  make_good_tree(t.path);
  const fs::path cls = t.path / "Train/cat";
  write_bytes(cls / "zero.jpg", "");
  const std::string png = read_bytes(t.path / "Train/cat/img2.png");
  write_bytes(cls / "truncated.png", png.substr(0, png.size() / 2));
  write_bytes(cls / "corrupt.png", std::string("\x89PNG\r\n\x1a\n", 8) + std::string(200, '\x5a'));
  write_bytes(cls / "fake.jpg", "this is plain text pretending to be a JPEG");
  write_bytes(cls / "bomb.ppm", "P6\n30000 30000\n255\n" + std::string(64, '\0'));
  fs::create_symlink(".", cls / "loop");                           // directory symlink loops
  fs::create_directories(cls / "sub");
  fs::create_symlink("../../cat", cls / "sub/up");
  fs::create_symlink("self.png", cls / "self.png");                // ELOOP on open
  fs::create_symlink("missing-target.png", cls / "dangling.png");  // dangling link
  std::vector<std::string> expected_names = {"zero.jpg", "truncated.png", "corrupt.png", "fake.jpg",
                                             "bomb.ppm", "loop", "sub/up", "self.png", "dangling.png"};
  // Unreadable permissions: root reads anything, so as root use a FIFO (never
  // opened for reading, which would block) to exercise "cannot be read".
  if (::geteuid() != 0) {
    write_png(cls / "noperm.png", 8, 8, 1);
    fs::permissions(cls / "noperm.png", fs::perms::none);
  } else {
    WARN("running as root: permission denial cannot be produced; a FIFO named noperm.png stands in");
    REQUIRE(::mkfifo((cls / "noperm.png").c_str(), 0600) == 0);
  }
  expected_names.push_back("noperm.png");

  Captured log;
  ScanOptions opts;
  opts.log = log.fn();
  auto ds = open_dataset(t.str(), Split::Train, opts);
  CHECK(ds->size() == 6);  // only the good images remain
  for (const auto& name : expected_names) {
    INFO(name);
    CHECK(log.mentions(name));
  }
  CHECK(log.mentions("decompression-bomb"));
  CHECK(log.mentions("10 skipped"));

  opts.strict = true;
  const std::string err = usage_error([&] { open_dataset(t.str(), Split::Train, opts); });
  CHECK(err.find("--strict-data") != std::string::npos);
  CHECK(err.find("zero.jpg") != std::string::npos);

  // Header-only verification misses the truncated PNG; the loader reports it instead.
  opts.strict = false;
  opts.verify = ScanOptions::Verify::Header;
  auto lazy = open_dataset(t.str(), Split::Train, opts);
  CHECK(lazy->size() == 7);
}

namespace {

// Two shards in one process: each combine() call waits for the other shard's call
// and hands both the elementwise sum, like the MPI_Allreduce the trainer uses.
class TwoShards {
 public:
  std::function<void(std::vector<int64_t>&)> combine() {
    return [this](std::vector<int64_t>& v) {
      std::unique_lock<std::mutex> lock(m_);
      const uint64_t round = round_;
      if (arrived_ == 0) sum_.assign(v.size(), 0);
      // Both shards must be in the same step (Catch assertions are not thread-safe).
      if (sum_.size() != v.size()) throw std::logic_error("shards called combine() with different sizes");
      for (size_t i = 0; i < v.size(); ++i) sum_[i] += v[i];
      if (++arrived_ == 2) {
        result_ = sum_;
        arrived_ = 0;
        ++round_;
        cv_.notify_all();
      } else {
        cv_.wait(lock, [&] { return round_ != round; });
      }
      v = result_;
    };
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<int64_t> sum_, result_;
  int arrived_ = 0;
  uint64_t round_ = 0;
};

struct ShardResult {
  std::vector<std::string> sources;
  std::string error;
  Captured log;
};

// Opens Train on two shards at once (roots may differ, to model node copies).
std::array<ShardResult, 2> open_two_shards(const std::array<std::string, 2>& roots, bool strict = false) {
  TwoShards net;
  std::array<ShardResult, 2> r;
  auto run = [&](int shard) {
    ScanOptions opts;
    opts.shard = shard;
    opts.shards = 2;
    opts.strict = strict;
    opts.combine = net.combine();
    opts.log = r[shard].log.fn();
    try {
      auto ds = open_dataset(roots[shard], Split::Train, opts);
      for (size_t i = 0; i < ds->size(); ++i) r[shard].sources.push_back(ds->source(i));
    } catch (const rd::UsageError& e) {
      r[shard].error = e.what();
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  return r;
}

}  // namespace

TEST_CASE("sharded verification: ranks split the decoding and agree on the result", "[data][scan]") {
  TempDir t;
  make_good_tree(t.path, 4);
  const fs::path cls = t.path / "Train/cat";
  const std::string png = read_bytes(cls / "img2.png");
  // Sorted order puts these at different indices, so both shards find one.
  write_bytes(cls / "a_truncated.png", png.substr(0, png.size() / 2));
  write_bytes(cls / "z_corrupt.png", "junk that is not an image");

  auto r = open_two_shards({t.str(), t.str()});
  for (auto& s : r) {
    CHECK(s.error.empty());
    CHECK(s.sources.size() == 8);
    CHECK(s.log.mentions("a_truncated.png"));  // named on every rank, whoever found it
    CHECK(s.log.mentions("z_corrupt.png"));
    CHECK(s.log.mentions("2 skipped"));
  }
  CHECK(r[0].sources == r[1].sources);
  ScanOptions single;
  auto ds = open_dataset(t.str(), Split::Train, single);
  CHECK(ds->size() == 8);  // the same as one unsharded scan

  auto strict = open_two_shards({t.str(), t.str()}, true);
  for (auto& s : strict) CHECK(s.error.find("--strict-data") != std::string::npos);

  // A node whose copy is missing or differs: every rank fails, none waits forever.
  TempDir u;
  make_good_tree(u.path, 4);
  write_png(u.path / "Train/cat/extra.png", 8, 8, 5);
  auto differ = open_two_shards({t.str(), u.str()});
  for (auto& s : differ) CHECK(s.error.find("different data") != std::string::npos);
  auto missing = open_two_shards({t.str(), (u.path / "nope").string()});
  CHECK(missing[0].error.find("another rank could not read") != std::string::npos);
  CHECK(missing[1].error.find("does not exist") != std::string::npos);
}

TEST_CASE("pixel limit rejects large images", "[data][scan]") {
  TempDir t;
  make_good_tree(t.path);
  ScanOptions opts;
  opts.max_pixels = 20 * 17;  // only the smallest images (20x16) pass
  Captured log;
  opts.log = log.fn();
  auto ds = open_dataset(t.str(), Split::Train, opts);
  CHECK(ds->size() == 2);
  CHECK(log.mentions("above the limit"));
}

TEST_CASE("layout errors: missing splits, class mismatch, empty classes", "[data][scan]") {
  TempDir t;
  ScanOptions opts;
  CHECK(usage_error([&] { open_dataset((t.path / "nope").string(), Split::Train, opts); })
            .find("does not exist") != std::string::npos);
  write_png(t.path / "Train/a/x.png", 8, 8, 1);
  write_png(t.path / "Train/b/x.png", 8, 8, 2);
  CHECK(usage_error([&] { open_dataset(t.str(), Split::Validation, opts); }).find("Validation") !=
        std::string::npos);
  write_png(t.path / "Validation/a/x.png", 8, 8, 1);
  write_png(t.path / "Validation/c/x.png", 8, 8, 3);
  const std::string diff = usage_error([&] { open_dataset(t.str(), Split::Validation, opts); });
  CHECK(diff.find("missing in Validation: b") != std::string::npos);
  CHECK(diff.find("only in Validation: c") != std::string::npos);

  fs::create_directories(t.path / "Train/empty");
  fs::remove_all(t.path / "Validation");
  Captured log;
  opts.log = log.fn();
  auto ds = open_dataset(t.str(), Split::Train, opts);
  CHECK(ds->class_names().size() == 3);  // the empty class keeps its label
  CHECK(log.mentions("empty: class folder has no usable image"));
  opts.strict = true;
  CHECK(usage_error([&] { open_dataset(t.str(), Split::Train, opts); }).find("empty") != std::string::npos);

  TempDir u;
  write_bytes(u.path / "Train/a/bad.png", "junk");
  opts.strict = false;
  CHECK(usage_error([&] { open_dataset(u.str(), Split::Train, opts); }).find("no usable image") !=
        std::string::npos);
  CHECK(usage_error([&] { open_dataset((u.path / "Train/a/bad.png").string(), Split::Train, opts); })
            .find("neither") != std::string::npos);
}

TEST_CASE("DistributedSampler: every index once per epoch before padding, 1..4 ranks", "[data][sampler]") {
  for (size_t n : {1u, 2u, 5u, 7u, 16u, 101u})
    for (int world = 1; world <= 4; ++world)
      for (bool drop : {false, true}) {
        if (drop && n < static_cast<size_t>(world)) continue;
        std::vector<int> seen(n, 0);
        size_t per_rank = 0;
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(n, world, r, true, 11, drop);
          s.set_epoch(2);
          const auto idx = s.indices();
          if (r == 0) per_rank = idx.size();
          REQUIRE(idx.size() == per_rank);  // equal step counts on all ranks
          for (auto i : idx) ++seen[static_cast<size_t>(i)];
        }
        const size_t total = per_rank * static_cast<size_t>(world);
        if (!drop) {
          REQUIRE(total >= n);
          REQUIRE(total - n < static_cast<size_t>(world));
          for (size_t i = 0; i < n; ++i) REQUIRE(seen[i] >= 1);  // padding repeats a few
        } else {
          REQUIRE(total == n / world * world);
          for (size_t i = 0; i < n; ++i) REQUIRE(seen[i] <= 1);
        }
      }
  DistributedSampler a(50, 2, 0, true, 1), b(50, 2, 0, true, 1);
  b.set_epoch(1);
  CHECK(a.indices() != b.indices());  // reshuffled each epoch
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), rd::UsageError);
}

TEST_CASE("exact validation sharding counts every sample once", "[data][sampler]") {
  for (size_t n : {1u, 3u, 10u, 363u})
    for (int world = 1; world <= 4; ++world) {
      std::vector<int> seen(n, 0);
      for (int r = 0; r < world; ++r)
        for (auto i : shard_exact(n, world, r)) ++seen[static_cast<size_t>(i)];
      for (size_t i = 0; i < n; ++i) REQUIRE(seen[i] == 1);
    }
}

namespace {
// In-memory dataset with varied image sizes, so loader tests need no files.
class PatternDataset : public Dataset {
 public:
  explicit PatternDataset(size_t n) : n_(n) {}
  size_t size() const override { return n_; }
  int32_t label(size_t i) const override { return static_cast<int32_t>(i % 3); }
  const std::vector<std::string>& class_names() const override { return names_; }
  std::string source(size_t i) const override { return "pattern" + std::to_string(i); }
  std::string description() const override { return "pattern"; }
  void load(size_t i, Image& out) const override {
    const int w = 40 + static_cast<int>(i % 5) * 9, h = 30 + static_cast<int>(i % 4) * 11;
    out.resize(w, h);
    const auto px = pattern(w, h, static_cast<int>(i));
    std::copy(px.begin(), px.end(), out.pixels.begin());
  }

 private:
  size_t n_;
  std::vector<std::string> names_{"a", "b", "c"};
};

struct EpochResult {
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  std::vector<int64_t> indices;
  std::vector<int> sizes;
};

EpochResult run_epoch(Loader& loader) {
  EpochResult r;
  Batch b;
  while (loader.next(b)) {
    r.pixels.insert(r.pixels.end(), b.images, b.images + b.image_bytes());
    r.labels.insert(r.labels.end(), b.labels.begin(), b.labels.end());
    r.indices.insert(r.indices.end(), b.indices.begin(), b.indices.end());
    r.sizes.push_back(b.n);
    REQUIRE(b.wait_seconds >= 0.0);
  }
  return r;
}
}  // namespace

TEST_CASE("default loader workers: the rank's allowed cores, one kept for the launching thread", "[data][loader]") {
  CHECK(loader_workers_for_cores(16, 1) == 15);  // a rank bound to 16 cores of its own
  CHECK(loader_workers_for_cores(16, 4) == 3);   // 4 ranks sharing one 16-core mask
  CHECK(loader_workers_for_cores(2, 1) == 1);
  CHECK(loader_workers_for_cores(1, 1) == 1);    // at least one, even on one core
  CHECK(loader_workers_for_cores(0, 0) == 1);    // an unreadable mask
  cpu_set_t saved;
  REQUIRE(sched_getaffinity(0, sizeof saved, &saved) == 0);
  const int allowed = CPU_COUNT(&saved);
  CHECK(default_loader_workers(1) == std::max(1, allowed - 1));
  CHECK(default_loader_workers(2) == std::max(1, allowed / 2 - 1));
  // Bound to one core (mpirun's default for <= 2 ranks), whatever the machine has.
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  const int on_one_core = default_loader_workers(1);
  REQUIRE(sched_setaffinity(0, sizeof saved, &saved) == 0);
  CHECK(on_one_core == 1);
}

TEST_CASE("loader output is identical for any number of workers", "[data][loader]") {
  PatternDataset ds(23);
  TransformPipeline tf({32, TransformConfig::Augment::AutoAugment}, true);
  DistributedSampler sampler(ds.size(), 1, 0, true, 3);
  sampler.set_epoch(1);
  LoaderOptions o;
  o.batch_size = 5;
  o.seed = 99;
  o.workers = 1;
  o.prefetch = 1;
  Loader one(ds, tf, o, sampler.indices(), 1);
  const EpochResult ref = run_epoch(one);
  CHECK(ref.sizes == std::vector<int>{5, 5, 5, 5, 3});
  CHECK(ref.indices == sampler.indices());
  for (size_t i = 0; i < ref.indices.size(); ++i)
    CHECK(ref.labels[i] == ds.label(static_cast<size_t>(ref.indices[i])));
  o.workers = 4;
  o.prefetch = 3;
  Loader many(ds, tf, o, sampler.indices(), 1);
  const EpochResult par = run_epoch(many);
  CHECK(par.pixels == ref.pixels);
  CHECK(par.indices == ref.indices);

  // The next epoch reuses threads and buffers and draws new augmentations.
  sampler.set_epoch(2);
  many.restart(sampler.indices(), 2);
  const EpochResult next = run_epoch(many);
  CHECK(next.indices == sampler.indices());
  CHECK(next.pixels != ref.pixels);

  // drop_last drops the short batch.
  o.drop_last = true;
  Loader dropping(ds, tf, o, sampler.indices(), 2);
  CHECK(dropping.num_batches() == 4);
  CHECK(run_epoch(dropping).sizes == std::vector<int>{5, 5, 5, 5});
}

TEST_CASE("loader: validation transform, allocator hook, clean shutdown mid-epoch", "[data][loader]") {
  PatternDataset ds(40);
  TransformPipeline val({24, TransformConfig::Augment::AutoAugment}, false);
  size_t allocated = 0;
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 3;
  o.allocator = [&](size_t bytes) {
    allocated += bytes;
    return std::shared_ptr<void>(std::malloc(bytes), [](void* p) { std::free(p); });
  };
  std::vector<int64_t> idx = shard_exact(ds.size(), 1, 0);
  {
    Loader loader(ds, val, o, idx, 0);
    CHECK(allocated == 4u * 24 * 24 * 3 * (3 + 1));  // prefetch + the consumer's buffer
    Batch b;
    REQUIRE(loader.next(b));
    // Validation = plain Resize: compare with resizing the source directly.
    Image src, expect;
    ds.load(static_cast<size_t>(b.indices[1]), src);
    resize_bilinear(src, 24, 24, expect);
    CHECK(std::equal(expect.pixels.begin(), expect.pixels.end(), b.images + 24 * 24 * 3));
    REQUIRE(loader.next(b));
  }  // destroyed with batches still queued: must join without hanging
  SUCCEED("loader destroyed mid-epoch");
  CHECK(allocated > 0);
  CHECK(default_loader_workers(1000) == 1);
}

// LoaderOptions::before_reuse: a slot handed out is given back (for refilling) only after
// the hook returned for it (a GPU upload may still read it), at the next next() and at
// restart(), never while the consumer holds it.
TEST_CASE("loader: before_reuse runs for a slot before the loader refills it", "[data][loader]") {
  PatternDataset ds(24);
  TransformPipeline val({8, TransformConfig::Augment::None}, false);
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.prefetch = 1;  // two slots: each is refilled while the epoch goes on
  std::vector<const void*> released;
  o.before_reuse = [&](const void* slot) { released.push_back(slot); };
  Loader loader(ds, val, o, shard_exact(ds.size(), 1, 0), 0);
  Batch b;
  std::vector<const void*> handed;
  while (loader.next(b)) {
    // The slot handed out before this one was released first; this one is not yet.
    CHECK(released.size() == handed.size());
    if (!handed.empty()) CHECK(released.back() == handed.back());
    handed.push_back(b.images);
  }
  CHECK(handed.size() == 6);
  CHECK(released.size() == handed.size());  // the last next() (end of epoch) released the last batch
  REQUIRE(loader.next(b) == false);
  loader.restart(shard_exact(ds.size(), 1, 0), 1);
  REQUIRE(loader.next(b));
  const void* held = b.images;
  const size_t before = released.size();
  loader.restart(shard_exact(ds.size(), 1, 0), 2);  // the held slot is refilled from here on
  REQUIRE(released.size() == before + 1);
  CHECK(released.back() == held);
}

TEST_CASE("presets: the tutorial default is unchanged, sizes, errors naming the flag", "[data][loader]") {
  PatternDataset ds(1);
  Image src, expect, work, scratch;
  // Default config: AutoAugment (NEAREST) from the sample's stream, then Resize((S, S)).
  TransformConfig tutorial;
  tutorial.image_size = 32;
  TransformPipeline train(tutorial, true);
  CHECK(train.output_size() == 32);
  ds.load(0, src);
  work = src;
  SampleRng rng(7, 2, 0);
  auto_augment(work, rng, scratch);
  resize_bilinear(work, 32, 32, expect);
  std::vector<uint8_t> out(32 * 32 * 3);
  TransformScratch ts;
  CropBox erase{1, 1, 1, 1};
  ds.load(0, src);
  train.apply(src, 7, 2, 0, out.data(), ts, &erase);
  CHECK(std::equal(out.begin(), out.end(), expect.pixels.begin()));
  CHECK(erase.height == 0);  // no RandomErasing unless asked for

  // Evaluation preset: Resize(shorter side R) then CenterCrop(C).
  TransformConfig preset = tutorial;
  preset.val_resize_size = 36;
  preset.val_crop_size = 24;
  preset.train_crop_size = 20;
  CHECK(TransformPipeline(preset, false).output_size() == 24);
  CHECK(TransformPipeline(preset, true).output_size() == 20);
  int w = 0, h = 0;
  shorter_side_size(40, 30, 36, w, h);
  CHECK((w == 48 && h == 36));  // int(36 * 40 / 30)
  shorter_side_size(30, 41, 36, w, h);
  CHECK((w == 36 && h == 49));  // int(49.2)

  auto refused = [](TransformConfig c) {
    try {
      TransformPipeline p(c, true);
    } catch (const rd::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TransformConfig bad = preset;
  bad.train_crop_size = 5;
  CHECK_THAT(refused(bad), Catch::Contains("--train-crop-size 5"));
  bad = preset;
  bad.val_resize_size = 5000;
  CHECK_THAT(refused(bad), Catch::Contains("--val-resize-size 5000"));
  bad = preset;
  bad.ra_magnitude = 31;
  CHECK_THAT(refused(bad), Catch::Contains("--ra-magnitude 31"));
  bad = preset;
  bad.hflip_prob = 1.5;
  CHECK_THAT(refused(bad), Catch::Contains("--hflip-prob"));
  bad = preset;
  bad.random_erase = -0.5;
  CHECK_THAT(refused(bad), Catch::Contains("--random-erase"));
}

TEST_CASE("presets in the loader: crop sizes, RandomErasing boxes, same for any number of workers",
          "[data][loader]") {
  PatternDataset ds(19);
  TransformConfig c;
  c.train_crop_size = 24;
  c.auto_augment = TransformConfig::Policy::TrivialAugmentWide;
  c.random_erase = 0.5;
  c.val_resize_size = 28;
  c.val_crop_size = 26;
  TransformPipeline train(c, true), val(c, false);
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 5;
  o.workers = 1;
  std::vector<int64_t> idx = shard_exact(ds.size(), 1, 0);
  Loader one(ds, train, o, idx, 3);
  o.workers = 3;
  Loader three(ds, train, o, idx, 3);
  Batch a, b;
  size_t erased = 0, samples = 0;
  while (one.next(a)) {
    REQUIRE(three.next(b));
    CHECK((a.h == 24 && a.w == 24));
    REQUIRE(a.erase_boxes.size() == static_cast<size_t>(a.n) * 4);
    CHECK(a.erase_boxes == b.erase_boxes);
    CHECK(std::equal(a.images, a.images + a.image_bytes(), b.images));
    for (int i = 0; i < a.n; ++i) {
      const int32_t* e = &a.erase_boxes[static_cast<size_t>(i) * 4];
      CHECK((e[0] >= 0 && e[1] >= 0 && e[0] + e[2] <= 24 && e[1] + e[3] <= 24));
      erased += e[2] > 0 && e[3] > 0;
      ++samples;
    }
  }
  CHECK(samples == ds.size());
  CHECK((erased > 0 && erased < samples));  // p = 0.5 over 19 samples
  // Evaluation: the centre crop of the shorter-side resize, and no erasing.
  Loader eval(ds, val, o, idx, 0);
  REQUIRE(eval.next(a));
  CHECK((a.h == 26 && a.w == 26));
  CHECK(a.erase_boxes.empty());
  Image src, resized;
  ds.load(static_cast<size_t>(a.indices[0]), src);
  int w = 0, h = 0;
  shorter_side_size(src.width, src.height, 28, w, h);
  resize_bilinear(src, w, h, resized);
  std::vector<uint8_t> expect(26 * 26 * 3);
  center_crop(resized, 26, expect.data());
  CHECK(std::equal(expect.begin(), expect.end(), a.images));
}

TEST_CASE("loader replaces an image that fails to decode and counts it", "[data][loader]") {
  TempDir t;
  make_good_tree(t.path, 2);
  const std::string png = read_bytes(t.path / "Train/ant/img1.png");
  write_bytes(t.path / "Train/ant/img1.png", png.substr(0, png.size() / 2));
  ScanOptions so;
  so.verify = ScanOptions::Verify::Header;
  auto ds = open_dataset(t.str(), Split::Train, so);
  REQUIRE(ds->size() == 4);
  TransformPipeline tf({16, TransformConfig::Augment::Flip}, true);
  Captured log;
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = 2;
  o.log = log.fn();
  Loader loader(*ds, tf, o, shard_exact(ds->size(), 1, 0), 0);
  Batch b;
  REQUIRE(loader.next(b));
  CHECK(b.n == 4);
  CHECK(loader.failed_samples() == 1);
  CHECK(log.mentions("img1.png"));
  CHECK_FALSE(loader.next(b));
}

TEST_CASE("split folders: an ImageNet-style train/ val/ tree, read and packed", "[data][scan]") {
  TempDir t;
  for (const char* split : {"train", "val"})
    for (int k = 0; k < 2; ++k) write_png(t.path / split / (k ? "b" : "a") / "x.png", 8, 8, k);
  ScanOptions opts;
  // The default names are missing: the message lists what is there and the flags to use.
  const std::string err = usage_error([&] { open_dataset(t.str(), Split::Train, opts); });
  CHECK(err.find("no folder 'Train' for the Train split (--train-split)") != std::string::npos);
  CHECK(err.find("folders there: train, val") != std::string::npos);
  CHECK(err.find("(use --train-split train --val-split val)") != std::string::npos);
  CHECK_FALSE(has_split(t.str(), Split::Validation));

  opts.folders.train = "train";
  opts.folders.validation = "val";
  CHECK(has_split(t.str(), Split::Validation, opts.folders));
  auto train = open_dataset(t.str(), Split::Train, opts);
  auto val = open_dataset(t.str(), Split::Validation, opts);
  CHECK(train->size() == 2);
  CHECK(val->size() == 2);
  CHECK(val->class_names() == std::vector<std::string>{"a", "b"});
  CHECK(val->description() == "ImageFolder " + t.str() + "/val");

  // Only the validation name is wrong: the hint is for that flag alone.
  opts.folders.validation = "Validation";
  const std::string val_err = usage_error([&] { open_dataset(t.str(), Split::Validation, opts); });
  CHECK(val_err.find("no folder 'Validation' for the Validation split (--val-split)") != std::string::npos);
  CHECK(val_err.find("(use --val-split val)") != std::string::npos);

  // A packed file keeps the canonical group names whatever the folders were called.
  PackOptions po;
  po.image_size = 8;
  po.threads = 1;
  po.scan.folders.train = "train";
  po.scan.folders.validation = "val";
  const std::string h5 = (t.path / "p.h5").string();
  const PackStats st = pack_dataset(t.str(), h5, po);
  CHECK(st.images[0] == 2);
  CHECK(st.images[1] == 2);
  CHECK(open_dataset(h5, Split::Validation)->size() == 2);
}

TEST_CASE("pack -> load round trip is bit-exact, bad .h5 files give clear errors", "[data][pack]") {
  TempDir t;
  make_good_tree(t.path / "set", 3);
  write_jpg(t.path / "set/Test/ant/j.jpg", 30, 20, 5);
  write_jpg(t.path / "set/Test/cat/j.jpg", 30, 20, 6);
  write_bytes(t.path / "set/Train/cat/broken.png", "junk");
  const std::string h5 = (t.path / "set.h5").string();
  PackOptions po;
  po.image_size = 16;
  po.threads = 2;
  const PackStats st = pack_dataset((t.path / "set").string(), h5, po);
  CHECK(st.images[0] == 6);
  CHECK(st.images[1] == 6);
  CHECK(st.images[2] == 2);
  CHECK(st.skipped == 1);
  REQUIRE(is_hdf5_file(h5));
  CHECK(has_split(h5, Split::Test));
  for (Split split : {Split::Train, Split::Validation, Split::Test}) {
    auto folder = open_dataset((t.path / "set").string(), split);
    auto packed = open_dataset(h5, split);
    REQUIRE(packed->size() == folder->size());
    CHECK(packed->class_names() == folder->class_names());
    CHECK(packed->stored_size() == 16);
    Image a, a16, b;
    for (size_t i = 0; i < packed->size(); ++i) {
      CHECK(packed->label(i) == folder->label(i));
      CHECK(folder->source(i).find(packed->source(i)) != std::string::npos);
      folder->load(i, a);
      resize_bilinear(a, 16, 16, a16);
      packed->load(i, b);
      REQUIRE(b.pixels == a16.pixels);
    }
  }
  // Compressed files go through HDF5's reader instead of direct reads.
  po.compress_level = 4;
  const std::string zipped = (t.path / "z.h5").string();
  pack_dataset((t.path / "set").string(), zipped, po);
  auto z = open_dataset(zipped, Split::Validation);
  auto u = open_dataset(h5, Split::Validation);
  Image zi, ui;
  z->load(5, zi);
  u->load(5, ui);
  CHECK(zi.pixels == ui.pixels);

  const std::string bytes = read_bytes(h5);
  write_bytes(t.path / "cut.h5", bytes.substr(0, bytes.size() / 2));
  CHECK_THROWS_AS(open_dataset((t.path / "cut.h5").string(), Split::Train), rd::UsageError);
  write_bytes(t.path / "text.h5", "not hdf5 at all");
  CHECK(usage_error([&] { open_dataset((t.path / "text.h5").string(), Split::Train); }).find("not an HDF5") !=
        std::string::npos);
  {
    const hid_t f = H5Fcreate((t.path / "foreign.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(f >= 0);
    H5Fclose(f);
  }
  CHECK(usage_error([&] { open_dataset((t.path / "foreign.h5").string(), Split::Train); })
            .find("not a resnet_ddp packed dataset") != std::string::npos);
}

namespace {
int call(int (*fn)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return fn(static_cast<int>(argv.size()), argv.data());
}
}  // namespace

TEST_CASE("synth and pack subcommands: output and flag errors", "[data][commands]") {
  TempDir t;
  const std::string out = (t.path / "synth").string();
  REQUIRE(call(synth_main, {"synth", "--out", out, "--train", "12", "--val", "6", "--size", "40x30",
                            "--format", "png", "--seed", "4"}) == 0);
  auto ds = open_dataset(out, Split::Train);
  CHECK(ds->size() == 12);
  CHECK(ds->class_names() == std::vector<std::string>{"C0", "C2", "C4"});
  CHECK(ds->class_counts() == std::vector<size_t>{4, 4, 4});
  Image img;
  ds->load(0, img);
  CHECK(img.width == 40);
  CHECK(img.height == 30);
  CHECK(call(synth_main, {"synth", "--out", out}) == 2);  // already populated
  CHECK(call(synth_main, {"synth", "--out", out + "2", "--size", "12"}) == 2);
  CHECK(call(synth_main, {"synth", "--bogus", "1"}) == 2);
  CHECK(call(synth_main, {"synth", "--help"}) == 0);
  CHECK(call(pack_main, {"pack", "--data", out}) == 2);  // --out missing
  CHECK(call(pack_main, {"pack", "--data", out, "--out", out + ".h5", "--image-size", "abc"}) == 2);
  REQUIRE(call(pack_main, {"pack", "--data", out, "--out", out + ".h5", "--image-size", "24"}) == 0);
  CHECK(open_dataset(out + ".h5", Split::Validation)->size() == 6);
  CHECK(call(pack_main, {"pack", "--data", (t.path / "none").string(), "--out", out + "x.h5"}) == 2);
}

TEST_CASE("jpeg_draft: DCT-domain JPEG downscaling in the loader and pack, off by default", "[data][commands]") {
  TempDir t;
  const std::string out = (t.path / "synth").string();
  REQUIRE(call(synth_main, {"synth", "--out", out, "--train", "6", "--val", "3", "--size", "256x192",
                            "--format", "jpg", "--seed", "2"}) == 0);
  Image img;
  open_dataset(out, Split::Train)->load(0, img);
  CHECK((img.width == 256 && img.height == 192));
  ScanOptions o;
  o.jpeg_draft = 60;  // PIL's draft: min(256 // 60, 192 // 60) = 3 -> scale 1/2, both sides >= 60
  open_dataset(out, Split::Train, o)->load(0, img);
  CHECK((img.width == 128 && img.height == 96));
  o.jpeg_draft = 24;  // 192 // 24 = 8 -> 1/8
  open_dataset(out, Split::Train, o)->load(0, img);
  CHECK((img.width == 32 && img.height == 24));

  REQUIRE(call(pack_main, {"pack", "--data", out, "--out", out + "_full.h5", "--image-size", "40"}) == 0);
  REQUIRE(call(pack_main, {"pack", "--data", out, "--out", out + "_draft.h5", "--image-size", "40",
                           "--jpeg-draft"}) == 0);
  Image full, draft;
  open_dataset(out + "_full.h5", Split::Train)->load(0, full);
  open_dataset(out + "_draft.h5", Split::Train)->load(0, draft);
  CHECK((draft.width == 40 && draft.height == 40));
  CHECK(full.pixels != draft.pixels);  // it changes pixels: that is why it is opt-in
}

TEST_CASE("JPEG files in a scan: truncated, header bombs, PIL-refused prefixes, full and header-only checks",
          "[data][scan]") {
  TempDir t;
  make_good_tree(t.path);
  const fs::path cls = t.path / "Train/cat";
  write_jpg(cls / "good.jpg", 30, 20, 7);
  const std::string jpg = read_bytes(cls / "good.jpg");
  write_bytes(cls / "cut.jpg", jpg.substr(0, jpg.size() - 40));  // headers intact, scan data cut
  std::string bomb = jpg;                                         // SOF0 claiming 20000 x 20000
  const size_t sof = bomb.find("\xFF\xC0");
  REQUIRE(sof != std::string::npos);
  bomb.replace(sof + 5, 4, std::string("\x4E\x20\x4E\x20", 4));
  write_bytes(cls / "bomb.jpg", bomb);
  write_bytes(cls / "fill.jpg", "\xFF" + jpg);               // FF FF D8: neither libjpeg nor PIL opens it
  write_bytes(cls / "header.jpg", jpg.substr(0, jpg.find("\xFF\xDA")));  // no scan at all

  Captured log;
  ScanOptions opts;
  opts.log = log.fn();
  auto ds = open_dataset(t.str(), Split::Train, opts);
  CHECK(ds->size() == 7);  // 6 PNGs + good.jpg
  CHECK(log.mentions("cut.jpg: decoding failed (truncated JPEG: premature end of data)"));
  CHECK(log.mentions("bomb.jpg: image is 20000x20000"));
  CHECK(log.mentions("fill.jpg: not a decodable image"));
  CHECK(log.mentions("header.jpg: not a decodable image (truncated JPEG"));

  // Header-only: the cut scan goes unnoticed until the loader decodes it.
  Captured lazy_log;
  opts.log = lazy_log.fn();
  opts.verify = ScanOptions::Verify::Header;
  auto lazy = open_dataset(t.str(), Split::Train, opts);
  CHECK(lazy->size() == 8);
  CHECK(lazy_log.mentions("bomb.jpg: image is 20000x20000"));
  CHECK(lazy_log.mentions("fill.jpg"));
  CHECK(lazy_log.mentions("header.jpg"));
  Image img;
  for (size_t i = 0; i < lazy->size(); ++i) {
    if (lazy->source(i).find("cut.jpg") == std::string::npos) continue;
    try {
      lazy->load(i, img);
      FAIL("cut.jpg decoded");
    } catch (const rd::Error& e) {
      CHECK(std::string(e.what()).find("cut.jpg") != std::string::npos);
    }
  }
}
