// Datasets: an ImageFolder directory tree (decoded as PIL does, see decode_image_file)
// or a packed HDF5 file written by `resnet_ddp pack`, behind one interface that hands
// out sample i as decoded uint8 RGB (H x W x 3, row-major, HWC).
//
// Layout of a directory dataset (torchvision's ImageFolder, one level per split):
//   DIR/Train/<class>/*.jpg   DIR/Validation/<class>/*.png   [DIR/Test/<class>/*]
// Class names are the sorted sub-folder names of Train (labels 0..K-1); the other
// splits must have exactly the same class folders. The split folders may have other
// names (SplitFolders: an ImageNet-style tree has train/ and val/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rd::data {

enum class Split : uint8_t { Train, Validation, Test };
const char* split_name(Split s);  // "Train", "Validation", "Test" (folder / HDF5 group name)

// The folder of each split in an ImageFolder tree (--train-split, --val-split). A packed
// .h5 file always names its groups Train / Validation / Test, whatever folders `pack`
// read them from, so these names only matter for directories.
struct SplitFolders {
  std::string train = "Train", validation = "Validation", test = "Test";
  const std::string& operator[](Split s) const {
    return s == Split::Train ? train : s == Split::Validation ? validation : test;
  }
};

// Refuses a split folder name that is not one folder inside the dataset root ("",
// ".", "..", or with a '/'); the message names `flag`.
void check_split_folder(const std::string& flag, const std::string& name);

// One decoded image, always 3 channels (RGB), 8 bits, row-major HWC.
// `pixels` keeps its capacity when reused, so steady-state decoding does not allocate.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;

  void resize(int w, int h) {
    width = w;
    height = h;
    pixels.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  }
  uint8_t* data() { return pixels.data(); }
  const uint8_t* data() const { return pixels.data(); }
  size_t bytes() const { return pixels.size(); }
};

// Receives one line (no trailing newline): skip warnings and the final counts.
using LogFn = std::function<void(const std::string&)>;

struct ScanOptions {
  // --strict-data: any unusable file is an error (rd::UsageError naming it) instead of
  // a skipped file with a one-line warning.
  bool strict = false;
  // Decompression-bomb guard: images with width*height above this are unusable.
  int64_t max_pixels = 64LL * 1000 * 1000;
  // --jpeg-draft: > 0 decodes JPEGs scaled down in the DCT domain (1/2, 1/4, 1/8) to
  // no less than this side, as PIL's draft() (see decode_image_file). Faster for
  // large photos, but the pixels differ from a full decode + Resize; 0 = off.
  int jpeg_draft = 0;
  // Full: decode every file while scanning (catches truncated/corrupt data before
  // training starts; parallel over `threads`). Header: read only the headers (fast
  // for huge trees; a file that fails to decode later is reported by the loader and
  // replaced by a black image). Strict mode always verifies fully.
  enum class Verify : uint8_t { Header, Full } verify = Verify::Full;
  int threads = 0;  // 0 = hardware concurrency
  LogFn log;        // null = silent
  SplitFolders folders;
  // Data-parallel verification: shard `shard` of `shards` decodes only every
  // shards-th file, and `combine` (elementwise sum over all shards, e.g. an
  // MPI_Allreduce) merges what each found, so every rank ends with the same list
  // after 1/shards of the decoding. Every shard must call the scan for the same
  // splits in the same order; a shard whose listing failed or differs still takes
  // part in `combine`, so the others fail with it instead of waiting.
  int shard = 0, shards = 1;
  std::function<void(std::vector<int64_t>&)> combine;
  // How messages name the dataset path: the flag or argument it came from
  // ("--data" for train and pack, "input" for predict's positional inputs).
  std::string data_flag = "--data";
  // How a strict-mode error names its cause and the way out (predict: unreadable files
  // are errors unless --skip-unreadable).
  std::string strict_flag = "--strict-data";
  std::string strict_hint;
  // Non-empty: the class names (e.g. a checkpoint's), so a split is read without the
  // Train folder the names usually come from; the split's class folders must match.
  std::vector<std::string> class_names;
  // Whether a class folder without a usable image is a problem (training needs every
  // class; scoring a model does not).
  bool require_every_class = true;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual size_t size() const = 0;
  virtual int32_t label(size_t i) const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  // Where sample i came from: the image path for a directory, the original path
  // recorded at pack time for an .h5 file.
  virtual std::string source(size_t i) const = 0;
  // "ImageFolder /data/set/Train" or "HDF5 /data/set.h5 (Train, 244x244)".
  virtual std::string description() const = 0;
  // Side of the stored square images for packed datasets, 0 when sizes vary.
  virtual int stored_size() const { return 0; }
  // Number of files skipped while scanning (unusable or with unknown extensions).
  virtual size_t skipped_files() const { return 0; }
  // Of those, the files with an image extension that could not be read.
  virtual size_t unreadable_files() const { return 0; }

  // Decodes sample i into `out` (RGB HWC). Thread-safe: workers call it concurrently.
  // Throws rd::Error naming the file when it cannot be read.
  virtual void load(size_t i, Image& out) const = 0;

  // Samples per class, indexed by label.
  std::vector<size_t> class_counts() const;
};

// Opens `path` (a directory in ImageFolder layout, or a .h5 file written by pack)
// and returns the given split. Errors (rd::UsageError, message names the path):
// missing path or split (naming the folders found), Validation classes differing from Train (the message lists
// the difference), no usable image in the split, a foreign or truncated .h5 file.
std::unique_ptr<Dataset> open_dataset(const std::string& path, Split split,
                                      const ScanOptions& opts = {});

// Whether `path` has this split (a folder, or a group in the .h5 file).
bool has_split(const std::string& path, Split split, const SplitFolders& folders = {});
bool is_hdf5_file(const std::string& path);  // by signature, not by extension

// "Train set size: N" followed by one line per class "  <name>: count".
std::string describe_counts(const Dataset& ds, Split split);

// Decodes one image file to RGB (3 channels, 8 bits), enforcing `max_pixels`. JPEG
// goes through libjpeg-turbo with Pillow's settings (pixels identical to PIL's
// Image.open(path).convert("RGB")), the other formats through stb_image. Throws
// rd::Error naming the file on any failure.
// jpeg_draft > 0 (off by default: it changes pixels) lets libjpeg scale a JPEG down
// in the DCT domain by 1/2, 1/4 or 1/8, the largest reduction that keeps both sides
// >= jpeg_draft, exactly as PIL's Image.draft("RGB", (jpeg_draft, jpeg_draft)).
void decode_image_file(const std::string& path, Image& out, int64_t max_pixels = 64LL * 1000 * 1000,
                       int jpeg_draft = 0);
// Decodes an in-memory encoded image (JPEG/PNG/...); `what` names it in errors.
void decode_image_memory(const uint8_t* bytes, size_t size, const std::string& what, Image& out,
                         int64_t max_pixels = 64LL * 1000 * 1000, int jpeg_draft = 0);
// Extensions an image file may have (lower case, with the dot).
bool has_image_extension(const std::string& filename);

}  // namespace rd::data
