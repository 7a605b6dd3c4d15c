// The op-test table: one row per Backend op of resnet_ddp/backend/ops.def, naming the
// checks (backend_checks.h) that would fail on a wrong result of that op. Every backend
// test registers the same checks (one Catch2 test case per check, one section per backend
// configuration), so a backend cannot skip an op the others test; test_op_table_coverage
// fails when an ops.def op has no row. A backend's test supplies only its configurations:
// how to make the backend, its shapes (OpCases) and its tolerances (OpCheckConfig).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend_checks.h"

namespace rd::test {

// The shapes and arguments a backend's checks run with (each backend keeps its own:
// the CPU covers more layouts and kernels, the emulated GPU runs slower).
struct SoftmaxCase {
  int64_t n, k;
  float smoothing, grad_scale;
};

struct OpCases {
  std::vector<Dims> copy_dims;
  std::vector<ConvCase> conv;
  // Finite differences only where in_c * out_c is at most this: larger shapes run the
  // same formulas in other kernels, and the reference comparison covers them.
  int64_t conv_fd_max_channel_product = INT64_MAX;
  std::vector<BnCase> batchnorm;
  std::vector<std::pair<BnCase, int>> bn_running_stats;  // (case, steps)
  std::vector<std::pair<BnCase, int>> bn_sync;           // (case, replicas)
  bool bn_sync_identical_ranks = false;
  std::vector<Dims> eltwise_dims;
  Dims reduced_precision_dims{2, 17, 3, 5};
  std::vector<PoolCase> maxpool;
  std::vector<Dims> global_avgpool_dims;
  std::vector<LinearCase> linear;
  std::vector<SoftmaxCase> softmax;
  std::vector<size_t> optimizer_counts;
  std::vector<std::pair<double, int>> ema;  // (decay, steps)
  std::vector<size_t> fill_counts;
};

// Which checks a configuration runs: a layout or algorithm variant of a backend needs only
// the checks whose result depends on it.
enum OpScope : unsigned {
  kFlatBuffers = 1,  // memory, matrices, losses, optimizers: the same in every layout
  kActivations = 2,  // activation-layout ops
  kConvolutions = 4,
  kEveryScope = 7,
};

struct OpCheckConfig {
  std::string label;
  std::function<std::unique_ptr<Backend>()> make;
  unsigned scopes = kEveryScope;
  const OpCases* cases = nullptr;
  Tol tol{};                      // convolutions, batch norm, pooling
  bool exact_storage = true;      // F32 activations: copies and elementwise ops are exact
  bool finite_differences = true; // only meaningful with F32 storage
  Tol linear_tol{};
  double linear_fd_step = 1e-2;
  Tol mix_tol{0, 0};
  // Reads device memory unordered with the backend's queued work (check_synchronize); a
  // backend whose work is done when its call returns: a plain copy.
  UnorderedRead read_unordered = [](Backend&, void* host, const void* device, size_t bytes) {
    std::memcpy(host, device, bytes);
  };
};

struct OpCheck {
  const char* name;
  OpScope scope;
  bool needs_exact_storage;  // finite differences or exact comparisons need F32 storage
  void (*run)(Backend&, const OpCheckConfig&);
};

struct OpRow {
  const char* op;  // the ops.def name
  std::vector<const OpCheck*> checks;
};

// ---- the checks, each over its backend's cases ---------------------------------------------

namespace op_checks {

inline const OpCheck memory{"allocate and host copies", kFlatBuffers, false,
                            [](Backend& be, const OpCheckConfig&) { check_allocate_and_copies(be); }};
inline const OpCheck fill_scale{"fill, scale, all_finite", kActivations, false,
                                [](Backend& be, const OpCheckConfig& cfg) {
                                  for (size_t count : cfg.cases->fill_counts) check_fill_scale_finite(be, count);
                                }};
inline const OpCheck unscale{"unscale_and_check", kFlatBuffers, false,
                             [](Backend& be, const OpCheckConfig&) { check_unscale_and_check(be); }};
inline const OpCheck amp_unscale{"amp_unscale", kFlatBuffers, false,
                                 [](Backend& be, const OpCheckConfig&) { check_amp_unscale(be); }};
inline const OpCheck amp_updates{"update ops with an AmpStepState", kFlatBuffers, false,
                                 [](Backend& be, const OpCheckConfig&) { check_updates_with_amp_state(be); }};
inline const OpCheck step_scalars{"update ops reading the step's lr and count in backend memory", kFlatBuffers, false,
                                  [](Backend& be, const OpCheckConfig&) { check_updates_with_step_scalars(be); }};
inline const OpCheck synchronize{"synchronize", kFlatBuffers, false, [](Backend& be, const OpCheckConfig& cfg) {
                                   check_synchronize(be, cfg.read_unordered);
                                 }};
inline const OpCheck nchw_copies{"NCHW copies round-trip", kActivations, true,
                                 [](Backend& be, const OpCheckConfig& cfg) {
                                   for (const Dims& d : cfg.cases->copy_dims) check_copy_roundtrip(be, d);
                                 }};
inline const OpCheck images_u8{"u8 images", kActivations, true, [](Backend& be, const OpCheckConfig&) {
                                 check_images_u8(be, Dims{2, 3, 5, 7}, false);
                                 check_images_u8(be, Dims{1, 3, 4, 4}, true);
                               }};
// Every precision: the values are exact in f16/bf16.
inline const OpCheck erase{"erase_rectangles", kActivations, false,
                           [](Backend& be, const OpCheckConfig&) { check_erase_rectangles(be); }};
inline const OpCheck queued_copies{"queued copies", kFlatBuffers, false,
                                   [](Backend& be, const OpCheckConfig&) { check_queued_copies(be); }};
inline const OpCheck timing{"timing marks", kFlatBuffers, false,
                            [](Backend& be, const OpCheckConfig&) { check_timing_marks(be); }};
inline const OpCheck conv{"conv2d forward/backward vs reference", kConvolutions, false,
                          [](Backend& be, const OpCheckConfig& cfg) {
                            for (const ConvCase& c : cfg.cases->conv) {
                              const bool fd = cfg.finite_differences &&
                                              c.in_c * c.out_c <= cfg.cases->conv_fd_max_channel_product;
                              check_conv2d(be, c, cfg.tol, fd);
                            }
                          }};
inline const OpCheck batchnorm{"batch norm train/eval/backward vs reference", kActivations, false,
                               [](Backend& be, const OpCheckConfig& cfg) {
                                 for (const BnCase& c : cfg.cases->batchnorm)
                                   check_batchnorm(be, c, cfg.tol, cfg.finite_differences);
                               }};
inline const OpCheck bn_running{"batch-norm running statistics over several steps", kActivations, false,
                                [](Backend& be, const OpCheckConfig& cfg) {
                                  for (const auto& [c, steps] : cfg.cases->bn_running_stats)
                                    check_batchnorm_running_stats(be, c, steps, cfg.tol);
                                }};
inline const OpCheck bn_sync{"batch norm through the SyncBatchNorm reducer seam", kActivations, false,
                             [](Backend& be, const OpCheckConfig& cfg) {
                               for (const auto& [c, replicas] : cfg.cases->bn_sync)
                                 check_batchnorm_sync(be, c, replicas);
                               if (cfg.cases->bn_sync_identical_ranks) check_batchnorm_sync_identical_ranks(be);
                             }};
// 16-bit storage compares with the reference of the stored values; the MLP head's hidden
// matrix stays F32 in every precision, so its ReLU must take F32.
inline const OpCheck eltwise{"relu, residual add, accumulate", kActivations, false,
                             [](Backend& be, const OpCheckConfig& cfg) {
                               if (cfg.exact_storage) {
                                 for (const Dims& d : cfg.cases->eltwise_dims) {
                                   check_relu(be, d);
                                   check_add(be, d, false);
                                   check_add(be, d, true);
                                   check_accumulate(be, d);
                                 }
                               } else {
                                 check_reduced_precision_elementwise(be, cfg.cases->reduced_precision_dims);
                               }
                               check_relu_matrix(be, 16, 512);
                               check_relu_matrix(be, 3, 7);
                             }};
inline const OpCheck maxpool{"max pool vs reference (ties, -inf padding) and finite differences", kActivations, true,
                             [](Backend& be, const OpCheckConfig& cfg) {
                               for (const PoolCase& c : cfg.cases->maxpool)
                                 for (const char* values : {"distinct", "ties", "negative"})
                                   check_maxpool(be, c, values);
                             }};
inline const OpCheck global_avgpool{"global average pool", kActivations, true,
                                    [](Backend& be, const OpCheckConfig& cfg) {
                                      for (const Dims& d : cfg.cases->global_avgpool_dims) check_global_avgpool(be, d);
                                    }};
inline const OpCheck linear{"linear", kFlatBuffers, false, [](Backend& be, const OpCheckConfig& cfg) {
                              for (const LinearCase& c : cfg.cases->linear)
                                check_linear(be, c, cfg.linear_tol, cfg.linear_fd_step);
                            }};
inline const OpCheck softmax{"label-smoothed softmax cross-entropy", kFlatBuffers, false,
                             [](Backend& be, const OpCheckConfig& cfg) {
                               for (const SoftmaxCase& c : cfg.cases->softmax)
                                 check_softmax_xent(be, c.n, c.k, c.smoothing, c.grad_scale);
                             }};
inline const OpCheck softmax_sums{"softmax_xent_sums equals softmax_xent", kFlatBuffers, false,
                                  [](Backend& be, const OpCheckConfig&) { check_softmax_xent_sums_all(be); }};
inline const OpCheck graphs{"graphs replay the recorded loss on staged labels", kFlatBuffers, false,
                            [](Backend& be, const OpCheckConfig&) { check_graphs(be); }};
inline const OpCheck graph_updates{"an optimizer step replayed from a graph, then a convolution", kConvolutions, false,
                                   [](Backend& be, const OpCheckConfig&) { check_graph_updates(be); }};
inline const OpCheck mixing{"MixUp / CutMix batch mixing and the mixed-target loss", kActivations, false,
                            [](Backend& be, const OpCheckConfig& cfg) { check_mixing_ops(be, cfg.mix_tol); }};
inline const OpCheck adam{"Adam steps", kFlatBuffers, false, [](Backend& be, const OpCheckConfig& cfg) {
                            for (size_t count : cfg.cases->optimizer_counts) {
                              check_adam(be, count, 0.f, 3);
                              check_adam(be, count, 0.01f, 3);
                            }
                          }};
inline const OpCheck sgd{"SGD steps", kFlatBuffers, false, [](Backend& be, const OpCheckConfig& cfg) {
                           for (size_t count : cfg.cases->optimizer_counts) {
                             check_sgd(be, count, 0.9f, 0.f, 0.f, false, 3);
                             check_sgd(be, count, 0.9f, 0.1f, 1e-4f, false, 3);
                             check_sgd(be, count, 0.9f, 0.f, 1e-4f, true, 3);
                             check_sgd(be, count, 0.f, 0.f, 0.f, false, 2);
                           }
                         }};
inline const OpCheck ema{"weight EMA", kFlatBuffers, false, [](Backend& be, const OpCheckConfig& cfg) {
                           for (size_t count : cfg.cases->optimizer_counts)
                             for (const auto& [decay, steps] : cfg.cases->ema) check_ema(be, count, decay, steps);
                         }};
inline const OpCheck segments{"per-segment sums of squares and steps", kFlatBuffers, false,
                              [](Backend& be, const OpCheckConfig&) { check_segment_ops(be); }};

// Every check once, in the order the tests register them.
inline const std::vector<const OpCheck*>& all() {
  static const std::vector<const OpCheck*> checks{
      &memory, &fill_scale, &unscale, &amp_unscale, &amp_updates, &step_scalars, &synchronize, &nchw_copies, &images_u8, &erase,
      &queued_copies,
      &timing, &conv, &batchnorm, &bn_running, &bn_sync, &eltwise, &maxpool, &global_avgpool,
      &linear, &softmax, &softmax_sums, &graphs, &graph_updates, &mixing, &adam, &sgd, &ema, &segments};
  return checks;
}

}  // namespace op_checks

// ---- the table: every ops.def op and the checks that exercise it ----------------------------

inline const std::vector<OpRow>& op_table() {
  using namespace op_checks;
  static const std::vector<OpRow> rows{
      {"allocate", {&memory}},
      {"copy_from_host", {&memory}},
      {"copy_to_host", {&memory}},
      {"fill", {&fill_scale}},
      {"copy_from_host_nchw", {&nchw_copies}},
      {"copy_to_host_nchw", {&nchw_copies}},
      {"images_u8_to_activation", {&images_u8}},
      {"erase_rectangles", {&erase}},
      {"synchronize", {&synchronize}},
      {"copy_to_host_queued", {&queued_copies}},
      {"wait_queued_copies", {&queued_copies}},
      {"timing_mark", {&timing}},
      {"timing_seconds", {&timing}},
      {"conv2d_forward", {&conv}},
      {"conv2d_backward_data", {&conv}},
      {"conv2d_backward_weights", {&conv}},
      {"batchnorm_forward_train", {&batchnorm, &bn_running, &bn_sync}},
      {"batchnorm_forward_eval", {&batchnorm}},
      {"batchnorm_backward", {&batchnorm, &bn_sync}},
      {"relu_forward", {&eltwise}},
      {"relu_backward", {&eltwise}},
      {"add_forward", {&eltwise}},
      {"add_backward", {&eltwise}},
      {"accumulate", {&eltwise}},
      {"maxpool_workspace_bytes", {&maxpool}},
      {"maxpool_forward", {&maxpool, &eltwise}},
      {"maxpool_backward", {&maxpool}},
      {"global_avgpool_forward", {&global_avgpool, &eltwise}},
      {"global_avgpool_backward", {&global_avgpool}},
      {"linear_forward", {&linear}},
      {"linear_backward", {&linear}},
      {"softmax_xent", {&softmax}},
      {"mix_images", {&mixing}},
      {"softmax_xent_mixed", {&mixing}},
      {"softmax_xent_sums", {&softmax_sums}},
      {"stage_loss_labels", {&graphs}},
      {"amp_unscale", {&amp_unscale}},
      {"set_optimizer_scalars", {&step_scalars, &graph_updates}},
      {"adam_step", {&adam, &amp_updates, &step_scalars}},
      {"sgd_step", {&sgd, &amp_updates, &step_scalars, &graph_updates}},
      {"segment_sum_squares", {&segments}},
      {"segment_step", {&segments, &amp_updates, &step_scalars}},
      {"ema_update", {&ema}},
      {"scale", {&fill_scale}},
      {"all_finite", {&fill_scale}},
      {"unscale_and_check", {&unscale}},
      {"graph_begin", {&graphs, &graph_updates}},
      {"graph_end", {&graphs, &graph_updates}},
      {"graph_launch", {&graphs, &graph_updates}},
      {"graph_drop", {&graphs, &graph_updates}},
      {"memory_events", {&graphs}},
  };
  return rows;
}

// The ops.def ops a check exercises (its rows), for the test names.
inline std::string ops_checked_by(const OpCheck& check) {
  std::string ops;
  for (const OpRow& row : op_table())
    for (const OpCheck* c : row.checks)
      if (c == &check) ops += (ops.empty() ? "" : ", ") + std::string(row.op);
  return ops;
}

// ---- running the table on one backend --------------------------------------------------------

inline bool config_runs(const OpCheckConfig& cfg, const OpCheck& check) {
  return (cfg.scopes & check.scope) && (cfg.exact_storage || !check.needs_exact_storage);
}

// One check on every configuration that runs it, a section per configuration (each makes
// its own backend, so a failure in one leaves the others' state alone).
inline void run_op_check(const OpCheck& check, const std::vector<OpCheckConfig>& configs) {
  if (configs.empty()) {
    WARN("no configuration of this backend can run here");
    return;
  }
  INFO("ops: " << ops_checked_by(check));
  bool any = false;
  for (const OpCheckConfig& cfg : configs) {
    if (!config_runs(cfg, check)) continue;
    any = true;
    DYNAMIC_SECTION(cfg.label) {
      std::unique_ptr<Backend> be = cfg.make();
      REQUIRE(be);
      check.run(*be, cfg);
    }
  }
  // A check no configuration runs would leave its ops untested on this backend.
  CHECK(any);
}

// A Catch2 test case per check: "<prefix>: <check name>", tagged `tags`; `configs` is
// called when a case runs (after any device probe). `checks`: every check, or the few a
// mode that changes only some ops re-runs.
class OpCheckInvoker : public Catch::ITestInvoker {
 public:
  OpCheckInvoker(const OpCheck& check, std::function<const std::vector<OpCheckConfig>&()> configs)
      : check_(check), configs_(std::move(configs)) {}
  void invoke() const override { run_op_check(check_, configs_()); }

 private:
  const OpCheck& check_;
  std::function<const std::vector<OpCheckConfig>&()> configs_;
};

inline bool register_op_table(const char* prefix, const char* tags,
                              std::function<const std::vector<OpCheckConfig>&()> configs,
                              const std::vector<const OpCheck*>& checks = op_checks::all()) {
  // Catch2 keeps references to the names: they live as long as the program.
  static std::deque<std::string> names;
  for (const OpCheck* check : checks) {
    names.push_back(std::string(prefix) + ": " + check->name);
    Catch::AutoReg(new OpCheckInvoker(*check, configs), CATCH_INTERNAL_LINEINFO, Catch::StringRef(),
                   Catch::NameAndTags(Catch::StringRef(names.back()), Catch::StringRef(tags)));
  }
  return true;
}

}  // namespace rd::test
