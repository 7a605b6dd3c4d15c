// Top-k accuracy (validation's Acc@5 and predict's top-5): which labels count, on
// logits whose torch.topk(5) answers are known, with ties, NaN and fewer classes than k.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "train/evaluate.h"

using namespace rd::train;

TEST_CASE("top-5 membership equals torch.topk's on tie-free rows and ties inside the top 5", "[train]") {
  // Rows and torch.topk(x, 5, 1, True, True).indices from PyTorch 1.13:
  //   row 0 -> [3, 5, 1, 6, 4]; row 1 (three 1.0s, all inside the top 5) -> [6, 2, 0, 1, 7].
  const std::vector<float> logits{0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 2.5f, 1.0f, -0.2f,
                                  1.0f, 1.0f, 1.0f,  0.0f, 0.0f, 0.0f, 2.0f, 0.5f};
  const bool in_row0[8] = {false, true, false, true, true, true, true, false};
  const bool in_row1[8] = {true, true, true, false, false, false, true, true};
  for (int label = 0; label < 8; ++label) {
    INFO("label " << label);
    CHECK(label_in_top_k(logits.data(), 8, label, 5) == in_row0[label]);
    CHECK(label_in_top_k(logits.data() + 8, 8, label, 5) == in_row1[label]);
  }
  CHECK(top_k_classes(logits.data(), 8, 5) == std::vector<int>{3, 5, 1, 6, 4});
  CHECK(top_k_classes(logits.data() + 8, 8, 5) == std::vector<int>{6, 0, 1, 2, 7});  // ties by index
  const std::vector<int32_t> labels{4, 3};
  CHECK(count_top_k(logits.data(), 8, labels.data(), 2, 5) == 1);
  CHECK(count_top_k(logits.data(), 8, labels.data(), 2, 1) == 0);
}

TEST_CASE("top-k: a tie across the k-th place goes to the lower class index, k = 1 is arg-max", "[train]") {
  // Seven equal logits: the first five classes are the top 5 (torch.topk leaves this
  // choice unspecified), and top-1 is class 0, torch.argmax's first maximum.
  const std::vector<float> equal(7, 0.25f);
  for (int label = 0; label < 7; ++label) CHECK(label_in_top_k(equal.data(), 7, label, 5) == (label < 5));
  CHECK(top_k_classes(equal.data(), 7, 5) == std::vector<int>{0, 1, 2, 3, 4});
  const std::vector<float> two_max{1.f, 3.f, 0.f, 3.f};
  CHECK(label_in_top_k(two_max.data(), 4, 1, 1));
  CHECK_FALSE(label_in_top_k(two_max.data(), 4, 3, 1));
  CHECK(top_k_classes(two_max.data(), 4, 2) == std::vector<int>{1, 3});
}

TEST_CASE("top-k: NaN ranks first, k caps at the class count, bad labels never count", "[train]") {
  const std::vector<float> with_nan{5.f, NAN, 4.f, 3.f, 2.f, 1.f, 0.f};
  CHECK(label_in_top_k(with_nan.data(), 7, 1, 1));         // torch.topk sorts NaN largest
  CHECK(label_in_top_k(with_nan.data(), 7, 3, 5));
  CHECK_FALSE(label_in_top_k(with_nan.data(), 7, 5, 5));   // 5, NaN, 4, 3, 2 are above 1
  CHECK(top_k_classes(with_nan.data(), 7, 3) == std::vector<int>{1, 0, 2});
  // Three classes: every label is in the "top 5" (torchvision's accuracy() would fail).
  const std::vector<float> three{-1.f, 0.f, 1.f};
  for (int label = 0; label < 3; ++label) CHECK(label_in_top_k(three.data(), 3, label, 5));
  CHECK(top_k_classes(three.data(), 3, 5) == std::vector<int>{2, 1, 0});
  CHECK_FALSE(label_in_top_k(three.data(), 3, -1, 5));
  CHECK_FALSE(label_in_top_k(three.data(), 3, 3, 5));
}

TEST_CASE("top-k: membership agrees with the ordered list on random rows with ties", "[train]") {
  uint32_t state = 12345;
  auto next = [&] { return (state = state * 1664525u + 1013904223u) >> 24; };
  for (int row = 0; row < 200; ++row) {
    const int classes = 1 + static_cast<int>(next() % 12);
    std::vector<float> z(static_cast<size_t>(classes));
    for (float& v : z) v = static_cast<float>(next() % 5);  // few values: many ties
    for (int k : {1, 3, 5}) {
      const std::vector<int> top = top_k_classes(z.data(), classes, k);
      for (int label = 0; label < classes; ++label) {
        const bool listed = std::find(top.begin(), top.end(), label) != top.end();
        CHECK(label_in_top_k(z.data(), classes, label, k) == listed);
      }
    }
  }
}
