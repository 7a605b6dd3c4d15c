// What every dataset shares (dataset.h): split names, the split folder check, the
// per-class counts. Apart from the folder and packed readers so that neither needs the other.
#include <sstream>

#include "resnet_ddp/data/dataset.h"
#include "resnet_ddp/errors.h"

namespace rd::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "Train";
    case Split::Validation: return "Validation";
    case Split::Test: return "Test";
  }
  return "?";
}

void check_split_folder(const std::string& flag, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    throw UsageError(flag + ": expected the name of a folder inside --data (e.g. train or val), got '" + name + "'");
}

std::vector<size_t> Dataset::class_counts() const {
  std::vector<size_t> counts(class_names().size(), 0);
  for (size_t i = 0; i < size(); ++i) {
    const int32_t l = label(i);
    if (l >= 0 && static_cast<size_t>(l) < counts.size()) ++counts[static_cast<size_t>(l)];
  }
  return counts;
}

std::string describe_counts(const Dataset& ds, Split split) {
  std::ostringstream os;
  os << split_name(split) << " set size: " << ds.size();
  const auto counts = ds.class_counts();
  for (size_t k = 0; k < counts.size(); ++k)
    os << "\n  " << ds.class_names()[k] << ": " << counts[k];
  return os.str();
}

}  // namespace rd::data
