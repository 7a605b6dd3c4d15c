#include "train/evaluate.h"

#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/transforms.h"

namespace rd::train {

Normalization normalization(const std::string& name) {
  if (name == "imagenet") return {data::kImagenetMean, data::kImagenetStd};
  return {};
}

Tensor& upload_batch(ResNet& model, const data::Batch& batch, const Normalization& norm) {
  Tensor& input = model.input_buffer(batch.n, batch.h, batch.w);
  model.backend().images_u8_to_activation(batch.images, input, norm.mean, norm.std);
  if (!batch.erase_boxes.empty()) model.backend().erase_rectangles(input, batch.erase_boxes.data());  // RandomErasing
  return input;
}

int64_t count_correct(const int32_t* predictions, const int32_t* labels, int n) {
  int64_t c = 0;
  for (int i = 0; i < n; ++i) c += predictions[i] == labels[i];
  return c;
}

void evaluate(ResNet& model, data::Loader& loader, const Normalization& norm,
              const std::function<void(const data::Batch&, const Tensor& logits)>& each) {
  model.train(false);
  data::Batch batch;
  while (loader.next(batch)) each(batch, model.forward(upload_batch(model, batch, norm)));
}

ScoreSums score(ResNet& model, data::Loader& loader, const Normalization& norm, float label_smoothing) {
  ScoreSums s;
  std::vector<int32_t> preds;
  evaluate(model, loader, norm, [&](const data::Batch& batch, const Tensor& logits) {
    preds.resize(static_cast<size_t>(batch.n));
    s.loss += model.backend().softmax_xent(logits, batch.labels.data(), label_smoothing, 1.f, nullptr, preds.data());
    s.correct += count_correct(preds.data(), batch.labels.data(), batch.n);
    s.count += batch.n;
  });
  return s;
}

}  // namespace rd::train
