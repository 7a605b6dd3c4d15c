#include "train/dataset_warnings.h"

namespace rd::train {

std::vector<std::string> dataset_warnings(const data::Dataset& ds, int image_size) {
  std::vector<std::string> out;
  const auto& classes = ds.class_names();
  if (classes.size() == 1)
    out.push_back(ds.description() + " has a single class ('" + classes.front() +
                  "'): every prediction is that class and accuracy is 1.0 whatever the model learns; an ImageFolder "
                  "root needs one folder per class (DIR/Train/<class>/*)");
  if (const int stored = ds.stored_size(); stored > 0 && stored < image_size)
    out.push_back(ds.description() + " stores " + std::to_string(stored) + "x" + std::to_string(stored) +
                  " images, smaller than --image-size " + std::to_string(image_size) +
                  ": they are upsampled (blurred, no added detail); pack again with --image-size " +
                  std::to_string(image_size) + " or train with --image-size " + std::to_string(stored));
  return out;
}

}  // namespace rd::train
