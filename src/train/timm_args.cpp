#include "train/timm_args.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

namespace rd::train {

namespace {

using Key = FlagSet::ConfigKey;
using Kind = FlagSet::ConfigKey::Kind;

// Keys of timm's train.py (1.0) that say how a run executes, logs or saves, never what
// it learns: left out, and listed once.
const std::set<std::string>& execution_keys() {
  static const std::set<std::string> keys = {
      "amp_dtype", "channels_last", "checkpoint_hist", "dataset_download", "dataset_trust_remote_code", "device",
      "device_modules", "dist_bn", "eval_metric", "experiment", "fast_norm", "fuser", "grad_checkpointing",
      "local_rank", "log_wandb", "wandb_project", "wandb_resume_id", "wandb_tags", "no_ddp_bb", "no_prefetcher",
      "pin_mem", "recovery_interval", "save_images", "synchronize_step", "torchcompile", "torchcompile_mode",
      "torchscript", "use_multi_epochs_loader", "worker_seeding", "val_interval", "model_ema_force_cpu",
      "num_classes", "start_epoch"};
  return keys;
}

// Keys that only matter when another key turns their feature on (checked there), or
// whose feature is checked through its switch: read with that key, never on their own.
const std::set<std::string>& dependent_keys() {
  static const std::set<std::string> keys = {
      "decay_epochs", "decay_milestones", "decay_rate", "warmup_lr", "warmup_prefix", "lr_base", "lr_base_size",
      "lr_base_scale", "mixup_prob", "mixup_switch_prob", "mixup_mode", "cutmix_minmax", "mixup_off_epoch",
      "remode", "recount", "resplit", "clip_mode", "color_jitter", "color_jitter_prob", "crop_pct", "img_size",
      "input_size", "interpolation", "train_interpolation", "scale", "ratio", "mean", "std", "hflip", "data",
      "data_dir", "model_ema_decay", "model_ema_warmup", "lr_noise_pct", "lr_noise_std", "lr_cycle_decay",
      "patience_epochs", "layer_decay_min_scale", "kd_distill_type", "kd_loss_type", "kd_temperature",
      "kd_token_distill_type", "naflex_loss_scale", "naflex_max_seq_len", "naflex_patch_size_probs",
      "naflex_patch_sizes", "naflex_patchify_channels_first", "naflex_train_seq_lens", "kd_student_feature_dim",
      "kd_teacher_feature_dim"};
  return keys;
}

// A value that leaves its feature off: null, false, 0, '', [] or {}.
bool is_off(const Key& k) {
  if (k.kind == Kind::Null) return true;
  if (k.kind != Kind::Scalar) return k.value.empty();
  if (k.value.empty() || k.value == "false" || k.value == "False") return true;
  char* end = nullptr;
  const double d = std::strtod(k.value.c_str(), &end);
  return *end == '\0' && d == 0.0;
}

// Features this program does not have, when on: timm's key -> what it does in timm.
const std::map<std::string, std::string>& missing_features() {
  static const std::map<std::string, std::string> m = {
      {"aug_splits", "augmentation splits (AugMix)"}, {"bce_loss", "binary cross-entropy loss"},
      {"bce_pos_weight", "binary cross-entropy loss"}, {"bce_sum", "binary cross-entropy loss"},
      {"bce_target_thresh", "binary cross-entropy loss"}, {"bn_eps", "batch-norm eps override"},
      {"bn_momentum", "batch-norm momentum override"}, {"drop", "dropout before the classifier"},
      {"drop_block", "DropBlock"}, {"drop_connect", "drop connect"}, {"drop_path", "stochastic depth (drop path)"},
      {"epoch_repeats", "epoch repeats"}, {"gaussian_blur_prob", "Gaussian blur augmentation"},
      {"grayscale_prob", "grayscale augmentation"}, {"head_init_bias", "classifier init override"},
      {"head_init_scale", "classifier init override"}, {"in_chans", "input channels other than 3"},
      {"jsd_loss", "Jensen-Shannon divergence loss (AugMix)"}, {"layer_decay", "layer-wise LR decay"},
      {"layer_decay_no_opt_scale", "layer-wise LR decay"}, {"lr_noise", "LR noise"},
      {"model_kwargs", "model arguments"}, {"opt_kwargs", "optimizer arguments"}, {"opt_betas", "optimizer betas"},
      {"opt_eps", "optimizer eps"}, {"split_bn", "split batch norm"}, {"vflip", "vertical flip"},
      {"no_aug", "no augmentation"}, {"sched_on_updates", "an LR schedule per step"},
{"train_crop_mode", "train crop modes"},
      {"pretrained", "timm's pretrained weights (use --init FILE.pth)"},
      {"pretrained_path", "timm's pretrained weights (use --init FILE.pth)"}, {"no_resume_opt", "resume without optimizer state"},
      {"class_map", "class maps"}, {"cooldown_epochs", "cooldown epochs at the minimum LR"},
      {"tta", "test-time augmentation"}, {"naflex_loader", "NaFlex variable-resolution loading"},
      {"kd_model_name", "knowledge distillation"}, {"distill_loss_weight", "knowledge distillation"},
      {"task_loss_weight", "knowledge distillation"}, {"model_dtype", "a model dtype"},
      {"input_img_mode", "input image modes"}, {"input_key", "dataset keys"}, {"target_key", "dataset keys"},
      {"train_num_samples", "iterable datasets"}, {"val_num_samples", "iterable datasets"},
      {"resume", "timm checkpoints (.pth.tar) to resume"}, {"initial_checkpoint", "timm checkpoints (.pth.tar)"}};
  return m;
}

// Features whose value equals this program's fixed behaviour: off and these values both work.
bool has_value(const Key* k, const std::string& v) { return k && k->kind == Kind::Scalar && k->value == v; }

// The shortest text that reads back as x (0.1, not 0.10000000000000001).
std::string fmt(double x) {
  char buf[32];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// timm's default crop_pct of each ResNet's default weights (pretrained_cfg), used for
// `crop_pct: null`.
double timm_default_crop_pct(const std::string& model) { return model == "wide_resnet50_2" ? 0.875 : 0.95; }

struct Translator {
  std::vector<Key>& keys;
  FlagSet::ConfigTranslation& out;
  std::map<std::string, const Key*> by_name;
  std::vector<Key> flags;  // the settings made, in file order

  const Key* get(const std::string& name) const {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  }
  double number(const Key* k, double fallback) const {
    if (!k || k->kind != Kind::Scalar) return fallback;
    char* end = nullptr;
    const double d = std::strtod(k->value.c_str(), &end);
    return k->value.empty() || *end != '\0' ? fallback : d;
  }
  void set(const Key& from, const std::string& flag, const std::string& value = "") {
    Key k;
    k.key = flag;
    k.line = from.line;
    k.value = value.empty() ? "true" : value;
    flags.push_back(k);
  }
  void refuse(const Key& k, const std::string& why, const std::string& moot_with = "") {
    const std::string value = k.kind == Kind::Null ? "null" : k.kind == Kind::List ? "[" + k.value + "]" : k.value.empty() ? "''" : k.value;
    out.refused.push_back({k.line, k.key + ": " + value + ": " + why, moot_with});
  }

  // lr: null: timm derives the lr from the global batch, as --lr-base does here (lr_base_scale
  // '' is timm's choice by optimizer, --lr-base-scale auto).
  bool lr_from_base_used() const {
    const Key* lr = get("lr");
    const Key* base = get("lr_base");
    return lr && lr->kind == Kind::Null && base && !is_off(*base);
  }
  void lr_from_base(const Key& base) {
    set(base, "--lr-base", base.value);
    if (const Key* size = get("lr_base_size"); size && !is_off(*size)) set(*size, "--lr-base-size", size->value);
    if (const Key* scale = get("lr_base_scale"); scale && !is_off(*scale)) set(*scale, "--lr-base-scale", scale->value);
  }
  void data(const Key& k);
  void schedule(const Key* sched);
  void optimizer(const Key& opt);
  void transforms();
  void augmentation();
  bool renamed(const Key& k);
  void mixing();
  void run();
};

void Translator::optimizer(const Key& opt) {
  const std::string o = opt.value;
  const double momentum = number(get("momentum"), 0.9);
  if (o == "sgd" || o == "nesterov" || o == "momentum") {
    set(opt, "--optimizer", "sgd");
    // timm's "sgd" is Nesterov SGD (timm.optim: sgd = nesterov, momentum = plain).
    if (o != "momentum" && momentum > 0) set(opt, "--nesterov");
  } else if (o == "adam" || o == "adamw" || o == "lamb" || o == "lars") {
    set(opt, "--optimizer", o);
  } else {
    refuse(opt, "not one of timm's optimizers implemented here (sgd, nesterov, momentum, adam, adamw, lamb, lars)",
           "--optimizer");
  }
}

void Translator::schedule(const Key* sched_key) {
  const Key& sched = sched_key ? *sched_key : keys.front();
  const std::string s = sched_key ? sched.value : "";
  if (!sched_key) {
    // No sched key (a hand-written file): the schedule flags' defaults stay.
  } else if (s == "cosine") {
    set(sched, "--lr-scheduler", "cosineannealinglr");
    if (const Key* m = get("min_lr")) set(*m, "--lr-min", m->kind == Kind::Scalar ? m->value : "0");
  } else if (s == "step") {
    set(sched, "--lr-scheduler", "steplr");
    if (const Key* d = get("decay_epochs")) set(*d, "--lr-step-size", fmt(std::floor(number(d, 90))));
    if (const Key* r = get("decay_rate")) set(*r, "--lr-gamma", r->value);
  } else if (s == "multistep") {
    set(sched, "--lr-scheduler", "multisteplr");
    if (const Key* d = get("decay_milestones")) set(*d, "--lr-milestones", d->value);
    if (const Key* r = get("decay_rate")) set(*r, "--lr-gamma", r->value);
  } else {
    refuse(sched, "timm's schedule is not implemented here (cosine, step and multistep are)", "--lr-scheduler");
  }
  for (const char* cycles : {"lr_cycle_limit", "lr_cycle_mul"})
    if (const Key* k = get(cycles); k && number(k, 1) != 1) refuse(*k, "LR cycles (restarts) are not implemented here");
  if (const Key* k = get("lr_k_decay"); k && number(k, 1) != 1) refuse(*k, "timm's k-decay cosine is not implemented here");
  const Key* warmup = get("warmup_epochs");
  const double w = number(warmup, 0);
  if (w <= 0) return;
  // timm's warmup with warmup_prefix: warmup_lr to lr linearly over W epochs, then the
  // schedule over `epochs` more: torchvision's LinearLR then the schedule over epochs - W.
  if (!has_value(get("warmup_prefix"), "true")) {
    refuse(*warmup,
           "without warmup_prefix: true, timm's schedule counts the warmup epochs as its own (its cosine does not "
           "restart after the warmup), which the schedules here do not: set warmup_prefix: true (or warmup_epochs: 0)",
           "--lr-warmup-epochs");
    return;
  }
  const double lr = number(get("lr"), -1), from = number(get("warmup_lr"), 1e-5);
  set(*warmup, "--lr-warmup-epochs", fmt(w));
  set(*warmup, "--lr-warmup-method", "linear");
  if (lr > 0) {
    if (from > 0 && from <= lr) set(*warmup, "--lr-warmup-decay", fmt(from / lr));
    else if (const Key* k = get("warmup_lr")) refuse(*k, "must be > 0 and <= lr here (the warmup's start factor)");
  } else if (const Key* k = get("warmup_lr"); k && lr_from_base_used()) {
    refuse(*k, "with lr: null the lr is derived from the global batch at run time, and the warmup here starts at a "
               "fraction of it, not at an absolute lr: give lr: as a number", "--lr");
  }
  if (const Key* e = get("epochs")) set(*e, "--epochs", fmt(number(e, 0) + w));  // timm's num_epochs
}

void Translator::transforms() {
  const Key* model = get("model");
  const std::string arch = model && model->kind == Kind::Scalar ? model->value : "";
  // The square size: img_size, else input_size [3, H, W], else timm's ResNets' 224.
  double size = 224;
  const Key* size_key = get("img_size");
  if (size_key && size_key->kind == Kind::Scalar) {
    size = number(size_key, 224);
  } else if (const Key* in = get("input_size"); in && in->kind == Kind::List) {
    const auto c1 = in->value.find(','), c2 = in->value.rfind(',');
    const std::string h = in->value.substr(c1 + 1, c2 - c1 - 1), w = in->value.substr(c2 + 1);
    if (h != w) refuse(*in, "a non-square input is not implemented here", "--train-crop-size");
    size = std::atof(w.c_str());
    size_key = in;
  }
  const Key& at = size_key ? *size_key : (model ? *model : keys.front());
  const Key* crop = get("crop_pct");
  const double pct = crop && crop->kind == Kind::Scalar ? number(crop, 0.875) : timm_default_crop_pct(arch);
  const std::string s = fmt(size);
  // timm's train transform is RandomResizedCrop + flip (+ aa); eval resizes the shorter
  // side to floor(size / crop_pct) and center-crops: torchvision's preset flags.
  set(at, "--image-size", s);
  set(at, "--train-crop-size", s);
  set(crop ? *crop : at, "--val-resize-size", fmt(std::floor(size / pct)));
  set(at, "--val-crop-size", s);
  if (const Key* h = get("hflip")) set(*h, "--hflip-prob", h->value);
  const Key* interp = get("interpolation");
  if (!has_value(interp, "bilinear"))
    refuse(interp ? *interp : at,
           "timm resizes with the model's interpolation (bicubic for its ResNets) when this is '' or null; only "
           "bilinear is implemented here: set interpolation: bilinear");
  const Key* train_interp = get("train_interpolation");
  if (train_interp && !has_value(train_interp, "bilinear"))
    refuse(*train_interp, "only bilinear is implemented here ('random' picks bilinear or bicubic per image): set "
                          "train_interpolation: bilinear");
  if (const Key* sc = get("scale"); sc && sc->kind == Kind::List && sc->value != "0.08,1.0" && sc->value != "0.08,1")
    refuse(*sc, "RandomResizedCrop's scale is 0.08-1 here (torchvision's)");
  if (const Key* r = get("ratio"); r && r->kind == Kind::List && r->value.rfind("0.75,1.333", 0) != 0)
    refuse(*r, "RandomResizedCrop's ratio is 3/4-4/3 here (torchvision's)");
  // timm's model mean/std (null) are ImageNet's for its ResNets.
  const Key* mean = get("mean");
  const Key* std = get("std");
  const bool imagenet_mean = !mean || mean->kind == Kind::Null || mean->value.rfind("0.485,0.456,0.406", 0) == 0;
  const bool imagenet_std = !std || std->kind == Kind::Null || std->value.rfind("0.229,0.224,0.225", 0) == 0;
  if (!imagenet_mean) refuse(*mean, "only ImageNet's mean and std are implemented here (--normalize imagenet)");
  if (!imagenet_std) refuse(*std, "only ImageNet's mean and std are implemented here (--normalize imagenet)");
  set(at, "--normalize", "imagenet");
  augmentation();
}

// After the flip: aa, else ColorJitter(color_jitter); random erasing after Normalize.
void Translator::augmentation() {
  const Key* aa = get("aa");
  if (aa && !is_off(*aa)) {
    const std::string a = aa->value;
    int magnitude = -1;
    char rest = 0;
    if (a == "original") {
      set(*aa, "--auto-augment", "imagenet");
    } else if ((std::sscanf(a.c_str(), "rand-m%d%c", &magnitude, &rest) == 1 ||
                (std::sscanf(a.c_str(), "rand-m%d-n2%c", &magnitude, &rest) == 1 && a.find("-n2") != std::string::npos)) &&
               magnitude >= 0 && magnitude <= 30) {
      // timm's rand-mM[-n2] without mstd/inc/... options: two ops at magnitude M, as torchvision's.
      set(*aa, "--auto-augment", "ra");
      set(*aa, "--ra-magnitude", std::to_string(magnitude));
    } else {
      refuse(*aa, "timm's policy is not implemented here (original = AutoAugment and rand-mM[-n2] = RandAugment "
                  "are; see --auto-augment)", "--auto-augment");
    }
  } else {
    const Key* cj = get("color_jitter");
    if (cj && !is_off(*cj))
      refuse(*cj, "timm applies ColorJitter when aa is null; not implemented here: set color_jitter: 0 (or an aa "
                  "policy)");
  }
  const Key* reprob = get("reprob");
  if (reprob && !is_off(*reprob)) {
    set(*reprob, "--random-erase", reprob->value);
    if (const Key* mode = get("remode"); mode && !has_value(mode, "const"))
      refuse(*mode, "random erasing fills with 0 after Normalize here (torchvision's): set remode: const");
    if (const Key* count = get("recount"); count && number(count, 1) != 1)
      refuse(*count, "random erasing erases one region here");
    if (const Key* split = get("resplit"); split && !is_off(*split)) refuse(*split, "not implemented here");
  }
}

void Translator::mixing() {
  const Key* mixup = get("mixup");
  const Key* cutmix = get("cutmix");
  const bool on_m = mixup && !is_off(*mixup), on_c = cutmix && !is_off(*cutmix);
  if (on_m) set(*mixup, "--mixup-alpha", mixup->value);
  if (on_c) set(*cutmix, "--cutmix-alpha", cutmix->value);
  if (!on_m && !on_c) return;
  // torchvision's batch mixing: every batch, one of the two with probability 1/2.
  if (const Key* p = get("mixup_prob"); p && number(p, 1) != 1) refuse(*p, "every batch is mixed here");
  if (const Key* p = get("mixup_switch_prob"); on_m && on_c && p && number(p, 0.5) != 0.5)
    refuse(*p, "MixUp or CutMix with probability 1/2 each here");
  if (const Key* m = get("mixup_mode"); m && !has_value(m, "batch")) refuse(*m, "only batch mode is implemented here");
  if (const Key* m = get("cutmix_minmax"); m && !is_off(*m)) refuse(*m, "not implemented here");
  if (const Key* m = get("mixup_off_epoch"); m && !is_off(*m)) refuse(*m, "not implemented here");
}

// A key that is one of this program's flags under another name; '' and null leave it.
bool Translator::renamed(const Key& k) {
  static const std::map<std::string, std::string> same = {
      {"train_split", "--train-split"}, {"val_split", "--val-split"}, {"output", "--output-dir"},
      {"seed", "--seed"}, {"workers", "--workers"}, {"momentum", "--momentum"}, {"batch_size", "--batch-size"},
      {"validation_batch_size", "--val-batch-size"}, {"log_interval", "--log-every"}, {"smoothing", "--label-smoothing"},
      {"grad_accum_steps", "--accum-steps"}};
  const auto it = same.find(k.key);
  if (it == same.end()) return false;
  if (k.kind == Kind::Scalar && !k.value.empty()) set(k, it->second, k.value);
  return true;
}

void Translator::run() {
  for (const auto& k : keys) by_name[k.key] = &k;
  const auto& missing = missing_features();
  std::vector<Key> rest;
  for (const auto& k : keys) {
    const std::string& n = k.key;
    const bool scalar = k.kind == Kind::Scalar;
    if (execution_keys().count(n)) {
      out.ignored.push_back(n);
    } else if (auto m = missing.find(n); m != missing.end()) {
      if (!is_off(k) && !(n == "in_chans" && k.value == "3"))
        refuse(k, std::string("timm's ") + m->second + " is not implemented here");
    } else if (n == "model") {
      set(k, "--arch", k.value);
      set(k, "--head", "fc");  // timm's ResNets end in one Linear
    } else if (n == "gp") {
      if (!is_off(k) && k.value != "avg") refuse(k, "the ResNets here pool by averaging (gp: avg)");
    } else if (n == "dataset") {
      if (scalar && !k.value.empty() && k.value.rfind("folder", 0) != 0 && k.value.rfind("imagefolder", 0) != 0)
        refuse(k, "only image folders (and packed .h5 files) are read here");
    } else if (n == "data_dir" || n == "data") {
      if (!is_off(k)) set(k, "--data", k.value);
    } else if (renamed(k)) {
      // the same setting under another name
    } else if (n == "epochs") {
      if (number(get("warmup_epochs"), 0) <= 0 || !has_value(get("warmup_prefix"), "true")) set(k, "--epochs", k.value);
    } else if (n == "lr") {
      if (k.kind != Kind::Null)
        set(k, "--lr", k.value);
      else if (const Key* base = get("lr_base"); base && !is_off(*base))
        lr_from_base(*base);  // timm's own default: lr: null
      else
        refuse(k, "timm derives it from lr_base x global batch / lr_base_size; give lr: (or --lr) as a number",
               "--lr");
    } else if (n == "opt") {
      optimizer(k);
    } else if (n == "weight_decay") {
      // timm's optimizers give biases and norm weights no weight decay.
      set(k, "--weight-decay", k.value);
      set(k, "--norm-weight-decay", "0");
      set(k, "--bias-weight-decay", "0");
    } else if (n == "sched") {
      // read by schedule()
    } else if (n == "min_lr" || n == "warmup_epochs" || n == "lr_cycle_limit" || n == "lr_cycle_mul" ||
               n == "lr_k_decay") {
      // read by schedule()
    } else if (n == "clip_grad") {
      if (is_off(k)) continue;
      if (!has_value(get("clip_mode"), "norm")) refuse(k, "only clip_mode: norm is implemented here");
      set(k, "--clip-grad-norm", k.value);
    } else if (n == "aug_repeats") {
      if (is_off(k)) continue;
      set(k, "--ra-sampler");
      set(k, "--ra-reps", fmt(std::floor(number(&k, 3))));
    } else if (n == "sync_bn" || n == "amp") {
      set(k, "--" + std::string(n == "amp" ? "amp" : "sync-bn"), is_off(k) ? "false" : "true");
    } else if (n == "model_ema") {
      if (!is_off(k))
        refuse(k, "timm's EMA decays by model_ema_decay at every step; the EMA here is torchvision's (its decay "
                  "adjusted by ranks x batch x --model-ema-steps / epochs): use --model-ema with --model-ema-decay",
               "--model-ema");
    } else if (n == "aa" || n == "reprob" || n == "mixup" || n == "cutmix" || dependent_keys().count(n)) {
      // read by transforms() and mixing()
    } else {
      rest.push_back(k);  // not timm's: read as a flag name
    }
  }
  schedule(get("sched"));
  transforms();
  mixing();
  std::stable_sort(flags.begin(), flags.end(), [](const Key& a, const Key& b) { return a.line < b.line; });
  flags.insert(flags.end(), rest.begin(), rest.end());
}

}  // namespace

bool looks_like_timm_args(const std::vector<FlagSet::ConfigKey>& keys) {
  static const std::set<std::string> marks = {"aa", "reprob", "img_size", "decay_rate", "warmup_lr", "min_lr",
                                              "cooldown_epochs", "data_dir", "checkpoint_hist", "lr_base"};
  for (const auto& k : keys)
    if (marks.count(k.key)) return true;
  return false;
}

void translate_timm_args(std::vector<FlagSet::ConfigKey>& keys, FlagSet::ConfigTranslation& out) {
  if (keys.empty()) return;
  Translator t{keys, out, {}, {}};
  t.run();
  keys = std::move(t.flags);
}

}  // namespace rd::train
