// ImageFolder scanning: class folders, recursive file discovery (following
// symlinks, with loop detection), and validation of every candidate image.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "data/internal.h"
#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/data/pack.h"
#include "resnet_ddp/errors.h"

namespace fs = std::filesystem;

namespace rd::data {

namespace {

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Sorted names of the sub-directories of `dir` (symlinks to directories included).
// The extension of a file name in lower case, with the dot ("" when it has none).
std::string lower_extension(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  if (dot == std::string::npos || dot == 0) return "";
  std::string ext = name.substr(dot);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

std::vector<std::string> sorted_subdirs(const std::string& dir, size_t* files_here,
                                        std::map<std::string, size_t>* by_extension = nullptr) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw UsageError(dir + ": cannot list directory (" + ec.message() + ")");
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (is_directory(e.path().string())) {
      names.push_back(name);
    } else {
      if (files_here) ++*files_here;
      if (by_extension) ++(*by_extension)[lower_extension(name)];
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct WalkState {
  std::set<std::pair<dev_t, ino_t>> visited;
  std::vector<std::string> problems;  // symlink loops and unreadable directories
  // (directory path, sorted file names) for torchvision's sorted(os.walk()) order.
  std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
};

void walk(const std::string& dir, WalkState& st) {
  struct stat s{};
  if (::stat(dir.c_str(), &s) != 0) {
    st.problems.push_back(dir + ": cannot access directory");
    return;
  }
  if (!st.visited.insert({s.st_dev, s.st_ino}).second) {
    st.problems.push_back(dir + ": directory visited twice (symlink loop), not followed");
    return;
  }
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) {
    st.problems.push_back(dir + ": cannot list directory (" + ec.message() + ")");
    return;
  }
  std::vector<std::string> files, subdirs;
  for (const auto& e : it) {
    const std::string path = e.path().string();
    const std::string name = e.path().filename().string();
    struct stat es{};
    if (::stat(path.c_str(), &es) == 0 && S_ISDIR(es.st_mode))
      subdirs.push_back(path);
    else
      files.push_back(name);  // regular, dangling or looping links: judged per file later
  }
  std::sort(files.begin(), files.end());
  st.dirs.emplace_back(dir, std::move(files));
  std::sort(subdirs.begin(), subdirs.end());
  for (const auto& d : subdirs) walk(d, st);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "(none)" : s;
}

// The flag that names a split's folder, for messages ("" for Test: it has none).
const char* split_flag(Split s) {
  return s == Split::Train ? "--train-split" : s == Split::Validation ? "--val-split" : "";
}

// A missing split folder: what is there instead, and the flag to use when one of
// those is the usual name of the split (ImageNet's train/ and val/, for instance).
[[noreturn]] void missing_split(const std::string& root, Split split, const SplitFolders& folders,
                                const std::string& data_flag) {
  const std::vector<std::string> found = sorted_subdirs(root, nullptr);
  const std::string flag = split_flag(split);
  std::string msg = data_flag + " " + root + ": no folder '" + folders[split] + "' for the " + split_name(split) +
                    " split" + (flag.empty() ? "" : " (" + flag + ")") + "; folders there: " + join(found);
  static const std::vector<std::string> usual[2] = {{"train", "training"},
                                                    {"val", "valid", "validation", "eval", "dev"}};
  auto lower = [](std::string x) {
    for (char& c : x) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return x;
  };
  // One hint for both splits: a tree with train/ lacks Validation/ too.
  std::string hint;
  for (Split s : {Split::Train, Split::Validation}) {
    if (is_directory(root + "/" + folders[s])) continue;
    for (const auto& f : found)
      for (const auto& u : usual[static_cast<int>(s)])
        if (lower(f) == u && hint.find(split_flag(s)) == std::string::npos)
          hint += std::string(hint.empty() ? "" : " ") + split_flag(s) + " " + f;
  }
  if (!hint.empty()) msg += " (use " + hint + ")";
  throw UsageError(msg);
}

// The class folders and candidate files of one split (no image is opened yet).
void list_folder_split(const std::string& root, Split split, const ScanOptions& opts, FolderScan& scan,
                       std::vector<std::string>& problems) {
  const SplitFolders& folders = opts.folders;
  if (!is_directory(root))
    throw UsageError(opts.data_flag + " " + root + ": not a directory or .h5 file");
  // Class names come from the training split, whichever split is read, unless the
  // caller knows them (a checkpoint's): then no Train folder is needed.
  std::string names_from = folders.train;
  if (!opts.class_names.empty()) {
    scan.class_names = opts.class_names;
    names_from = "the checkpoint's classes";
  } else {
    const std::string train_dir = root + "/" + folders.train;
    if (!is_directory(train_dir)) missing_split(root, Split::Train, folders, opts.data_flag);
    scan.class_names = sorted_subdirs(train_dir, nullptr);
    if (scan.class_names.empty()) throw UsageError(train_dir + ": no class folders");
  }

  const std::string& name = folders[split];
  const std::string split_dir = root + "/" + name;
  if (!is_directory(split_dir)) missing_split(root, split, folders, opts.data_flag);
  size_t loose_files = 0;
  const auto split_classes = sorted_subdirs(split_dir, &loose_files, &scan.ignored_by_extension);
  if ((split != Split::Train || !opts.class_names.empty()) && split_classes != scan.class_names) {
    std::vector<std::string> missing, extra;
    std::set_difference(scan.class_names.begin(), scan.class_names.end(), split_classes.begin(),
                        split_classes.end(), std::back_inserter(missing));
    std::set_difference(split_classes.begin(), split_classes.end(), scan.class_names.begin(),
                        scan.class_names.end(), std::back_inserter(extra));
    throw UsageError(split_dir + ": class folders differ from " + names_from + ": missing in " + name + ": " +
                     join(missing) + "; only in " + name + ": " + join(extra));
  }
  scan.ignored += loose_files;

  // A build without libtiff / libwebp refuses a dataset holding such images outright:
  // skipping them would train on another dataset than torchvision's ImageFolder sees.
  std::map<std::string, std::pair<size_t, std::string>> not_built;  // format -> count, first file
  for (size_t label = 0; label < scan.class_names.size(); ++label) {
    const std::string& cls = scan.class_names[label];
    WalkState ws;
    walk(split_dir + "/" + cls, ws);
    std::sort(ws.dirs.begin(), ws.dirs.end());
    for (auto& p : ws.problems) problems.push_back(std::move(p));
    const size_t prefix = split_dir.size() + 1;
    for (const auto& [dir, files] : ws.dirs)
      for (const auto& f : files) {
        if (!has_image_extension(f)) {
          ++scan.ignored;
          ++scan.ignored_by_extension[lower_extension(f)];
          continue;
        }
        if (const std::string format = unsupported_image_format(f); !format.empty()) {
          auto& [n, first] = not_built[format];
          if (n++ == 0) first = dir + "/" + f;
        }
        FolderEntry e;
        e.path = dir + "/" + f;
        e.relative = e.path.substr(prefix);
        e.label = static_cast<int32_t>(label);
        scan.entries.push_back(std::move(e));
      }
  }
  for (const auto& [format, found] : not_built)
    throw UsageError(split_dir + ": " + std::to_string(found.first) + " " + format + " image(s) (" + found.second +
                     (found.first > 1 ? ", ..." : "") + "), and " + format_not_built(format));
}

// FNV-1a over the relative paths, folded to 20 bits: ranks compare listings
// without sending them (see scan_folder_split).
int64_t listing_hash(const FolderScan& scan) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& e : scan.entries)
    for (const char c : e.relative + '\n') h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<int64_t>((h ^ (h >> 20) ^ (h >> 40)) & 0xFFFFF);
}

// The first collective step of sharded verification (ScanOptions::combine): every
// shard reports whether its own checks failed and what it listed. Values x_i are
// all equal iff shards * sum(x^2) == sum(x)^2, which every shard evaluates from the
// same sums, so all of them throw or go on together. Rethrows this shard's error.
void agree_on_listing(const ScanOptions& opts, const std::exception_ptr& failed, int64_t n, int64_t h,
                      const std::string& what) {
  std::vector<int64_t> seen{failed ? 1 : 0, n, n * n, h, h * h};
  opts.combine(seen);
  if (failed) std::rethrow_exception(failed);
  if (seen[0] != 0) throw UsageError(what + ": another rank could not read its copy of the data (see its error)");
  const auto same = [&](int64_t sum, int64_t sum_sq) {
    return static_cast<__int128>(opts.shards) * sum_sq == static_cast<__int128>(sum) * sum;
  };
  if (!same(seen[1], seen[2]) || !same(seen[3], seen[4]))
    throw UsageError(what + ": the ranks see different data (" + std::to_string(n) +
                     " images here): every node needs the same copy (see jobs/stage_data.sh)");
}

bool sharded(const ScanOptions& opts) { return opts.shards > 1 && static_cast<bool>(opts.combine); }

// Each listed file decoded (or its header read), in parallel; this shard's share only
// when sharded, then the shards' verdicts combined. The errors in scan order (empty:
// usable), so logs are deterministic.
std::vector<std::string> verify_entries(const FolderScan& scan, const ScanOptions& opts) {
  const bool full = opts.strict || opts.verify == ScanOptions::Verify::Full;
  auto check = [&](size_t i) -> std::string {
    try {
      if (full) {
        thread_local Image img;
        decode_image_file(scan.entries[i].path, img, opts.max_pixels, opts.jpeg_draft);
      } else {
        probe_image_file(scan.entries[i].path, opts.max_pixels);
      }
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  };
  std::vector<std::string> errors(scan.entries.size());
  const size_t shards = sharded(opts) ? static_cast<size_t>(opts.shards) : 1;
  const size_t shard = sharded(opts) ? static_cast<size_t>(opts.shard) : 0;
  parallel_for(scan.entries.size(), opts.threads, [&](size_t i) {
    if (i % shards == shard) errors[i] = check(i);
  });
  if (sharded(opts)) {
    std::vector<int64_t> bad(scan.entries.size());
    for (size_t i = 0; i < bad.size(); ++i) bad[i] = errors[i].empty() ? 0 : 1;
    opts.combine(bad);
    // Files another shard rejected: checked again here for the message (few).
    for (size_t i = 0; i < bad.size(); ++i)
      if (bad[i] != 0 && errors[i].empty()) {
        errors[i] = check(i);
        if (errors[i].empty()) errors[i] = scan.entries[i].path + ": unreadable on another rank (node copies differ?)";
      }
  }
  return errors;
}

// Which extensions were passed over, most frequent first (": 12 .txt, 3 .xml"): a
// dataset of a format this program does not read says so instead of only "no usable image".
std::string extension_summary(const FolderScan& scan) {
  std::string by_ext;
  std::vector<std::pair<size_t, std::string>> v;
  for (const auto& [ext, n] : scan.ignored_by_extension) v.emplace_back(n, ext);
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < v.size() && i < 5; ++i)
    by_ext += (i ? ", " : ": ") + std::to_string(v[i].first) + " " + (v[i].second.empty() ? "without extension" : v[i].second);
  if (v.size() > 5) by_ext += ", ...";
  return by_ext;
}

}  // namespace

FolderScan scan_folder_split(const std::string& root, Split split, const ScanOptions& opts) {
  const auto log = [&](const std::string& line) {
    if (opts.log) opts.log(line);
  };
  const std::string split_dir = root + "/" + opts.folders[split];
  FolderScan scan;
  std::vector<std::string> problems;
  std::exception_ptr failed;
  try {
    list_folder_split(root, split, opts, scan, problems);
  } catch (...) {
    if (!sharded(opts)) throw;
    failed = std::current_exception();
  }
  // All shards agree on the listing before dividing the files by index.
  if (sharded(opts))
    agree_on_listing(opts, failed, static_cast<int64_t>(scan.entries.size()), listing_hash(scan), split_dir);

  const std::vector<std::string> errors = verify_entries(scan, opts);
  std::vector<FolderEntry> usable;
  usable.reserve(scan.entries.size());
  for (size_t i = 0; i < scan.entries.size(); ++i) {
    if (errors[i].empty())
      usable.push_back(std::move(scan.entries[i]));
    else
      problems.push_back(errors[i]);
  }
  scan.entries = std::move(usable);
  scan.skipped = problems.size();

  std::vector<size_t> counts(scan.class_names.size(), 0);
  for (const auto& e : scan.entries) ++counts[static_cast<size_t>(e.label)];
  for (size_t k = 0; k < counts.size() && opts.require_every_class; ++k)
    if (counts[k] == 0)
      problems.push_back(split_dir + "/" + scan.class_names[k] + ": class folder has no usable image");

  if (opts.strict && !problems.empty()) {
    std::string msg = opts.strict_flag + ": " + std::to_string(problems.size()) + " problem(s) in " + split_dir +
                      opts.strict_hint + ":";
    const size_t shown = std::min<size_t>(problems.size(), 20);
    for (size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
    if (shown < problems.size()) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    throw UsageError(msg);
  }
  for (const auto& p : problems) log("warning: skipping " + p);
  const std::string by_ext = extension_summary(scan);
  if (scan.entries.empty())
    throw UsageError(split_dir + ": no usable image in the " + split_name(split) + " split" +
                     (scan.skipped ? " (" + std::to_string(scan.skipped) + " unreadable)" : std::string()) +
                     (scan.ignored ? "; " + std::to_string(scan.ignored) + " file(s) skipped for their extension" +
                                         by_ext + " (read: .jpg .jpeg .png .bmp .tga .gif .ppm .pgm .tif .tiff .webp)"
                                   : std::string()));
  log(std::string(split_name(split)) + ": " + std::to_string(scan.entries.size()) + " images in " +
      std::to_string(scan.class_names.size()) + " classes from " + split_dir + " (" +
      std::to_string(scan.skipped) + " skipped, " + std::to_string(scan.ignored) +
      " non-image files ignored" + by_ext + ")");
  return scan;
}

namespace {

class FolderDataset final : public Dataset {
 public:
  FolderDataset(std::string dir, FolderScan scan, int64_t max_pixels, int jpeg_draft)
      : dir_(std::move(dir)), scan_(std::move(scan)), max_pixels_(max_pixels), jpeg_draft_(jpeg_draft) {}
  size_t size() const override { return scan_.entries.size(); }
  int32_t label(size_t i) const override { return scan_.entries.at(i).label; }
  const std::vector<std::string>& class_names() const override { return scan_.class_names; }
  std::string source(size_t i) const override { return scan_.entries.at(i).path; }
  std::string description() const override { return "ImageFolder " + dir_; }
  size_t skipped_files() const override { return scan_.skipped + scan_.ignored; }
  size_t unreadable_files() const override { return scan_.skipped; }
  void load(size_t i, Image& out) const override {
    decode_image_file(scan_.entries.at(i).path, out, max_pixels_, jpeg_draft_);
  }

 private:
  std::string dir_;
  FolderScan scan_;
  int64_t max_pixels_;
  int jpeg_draft_;
};

}  // namespace

namespace {

// The checks before a folder scan; returns the packed dataset when `path` is one.
std::unique_ptr<Dataset> open_packed_or_check_folder(const std::string& path, Split split, const std::string& flag) {
  if (is_hdf5_file(path)) return open_packed_dataset(path, split, flag);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    throw UsageError(flag + " " + path + ": does not exist");
  const auto dot = path.find_last_of('.');
  const std::string ext = dot == std::string::npos ? "" : path.substr(dot);
  if (!S_ISDIR(st.st_mode) && (ext == ".h5" || ext == ".hdf5"))
    throw UsageError(flag + " " + path + ": not an HDF5 file (bad signature; truncated, or not written by `resnet_ddp pack`)");
  if (!S_ISDIR(st.st_mode))
    throw UsageError(flag + " " + path + ": neither an ImageFolder directory nor an HDF5 file (.h5)");
  return nullptr;
}

}  // namespace

std::unique_ptr<Dataset> open_dataset(const std::string& path, Split split, const ScanOptions& opts) {
  std::unique_ptr<Dataset> packed;
  std::exception_ptr failed;
  try {
    packed = open_packed_or_check_folder(path, split, opts.data_flag);
  } catch (...) {
    if (!sharded(opts)) throw;
    failed = std::current_exception();
  }
  // Sharded verification: a rank whose checks failed here, or that opened a packed
  // file, still takes part in the listing agreement the folder scans start with.
  if (sharded(opts) && (failed || packed))
    agree_on_listing(opts, failed, packed ? static_cast<int64_t>(packed->size()) : 0, -1,
                     path + "/" + (packed ? split_name(split) : opts.folders[split]));
  if (packed) return packed;
  FolderScan scan = scan_folder_split(path, split, opts);
  return std::make_unique<FolderDataset>(path + "/" + opts.folders[split], std::move(scan),
                                         opts.max_pixels, opts.jpeg_draft);
}

bool has_split(const std::string& path, Split split, const SplitFolders& folders) {
  if (is_hdf5_file(path)) return packed_has_split(path, split);
  return is_directory(path + "/" + folders[split]);
}

}  // namespace rd::data
