#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/data/transforms.h"
#include "resnet_ddp/errors.h"

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

namespace {
// Whether class a ranks above class b (see label_in_top_k).
bool ranks_above(const float* z, int a, int b) {
  const bool nan_a = std::isnan(z[a]), nan_b = std::isnan(z[b]);
  if (nan_a != nan_b) return nan_a;
  if (!nan_a && z[a] != z[b]) return z[a] > z[b];
  return a < b;
}
}  // namespace

bool label_in_top_k(const float* logits, int classes, int label, int k) {
  if (label < 0 || label >= classes) return false;
  int above = 0;
  for (int c = 0; c < classes && above < k; ++c) above += c != label && ranks_above(logits, c, label);
  return above < k;
}

std::vector<int> top_k_classes(const float* logits, int classes, int k) {
  std::vector<int> order(static_cast<size_t>(classes));
  std::iota(order.begin(), order.end(), 0);
  const auto kept = order.begin() + std::min(k, classes);
  std::partial_sort(order.begin(), kept, order.end(), [&](int a, int b) { return ranks_above(logits, a, b); });
  order.erase(kept, order.end());
  return order;
}

int64_t count_top_k(const float* logits, int classes, const int32_t* labels, int n, int k) {
  int64_t c = 0;
  for (int i = 0; i < n; ++i) c += label_in_top_k(logits + static_cast<size_t>(i) * classes, classes, labels[i], k);
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
  std::vector<float> host_logits;
  evaluate(model, loader, norm, [&](const data::Batch& batch, const Tensor& logits) {
    preds.resize(static_cast<size_t>(batch.n));
    s.loss += model.backend().softmax_xent(logits, batch.labels.data(), label_smoothing, 1.f, nullptr, preds.data());
    s.correct += count_correct(preds.data(), batch.labels.data(), batch.n);
    // Top-5 on the host: a copy of n x classes floats per validation batch.
    RD_CHECK(logits.dtype == DType::F32 && logits.shape.rank == 2 && logits.shape[0] == batch.n,
             "validation: logits must be f32 (n, classes), got " << logits.describe());
    host_logits.resize(static_cast<size_t>(logits.numel()));
    model.backend().copy_to_host(host_logits.data(), logits.data, host_logits.size() * sizeof(float));
    s.correct_top5 += count_top_k(host_logits.data(), static_cast<int>(logits.shape[1]), batch.labels.data(), batch.n,
                                  kTopK);
    s.count += batch.n;
  });
  return s;
}

}  // namespace rd::train
