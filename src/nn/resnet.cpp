// torchvision's ResNets (18/34/50/101/152, wide_resnet50_2, resnext50_32x4d) on the
// flat arenas.
//
// Backward visits each block's downsample branch before its main path, so
// gradients become final in reverse state_dict order — exactly the order DDP
// buckets are laid out in, so a bucket fires as soon as backward passes it.
#include "resnet_ddp/nn/resnet.h"

#include <memory>

#include "nn/layers.h"
#include "resnet_ddp/errors.h"

namespace rd {

namespace {

// torchvision's ResNet(block, layers, groups, width_per_group): `widths` are the
// stages' `planes`; a Bottleneck's inner width is planes * width_per_group / 64 * groups
// (its 3x3 conv has `groups` groups) and its output planes * 4.
struct ArchSpec {
  bool bottleneck;
  std::vector<int> blocks;
  int stem_width;
  std::vector<int> widths;
  int groups = 1;
  int width_per_group = 64;
};

ArchSpec arch_spec(const std::string& arch) {
  const std::vector<int> planes{64, 128, 256, 512};
  if (arch == "resnet18") return {false, {2, 2, 2, 2}, 64, planes};
  if (arch == "resnet34") return {false, {3, 4, 6, 3}, 64, planes};
  if (arch == "resnet50") return {true, {3, 4, 6, 3}, 64, planes};
  if (arch == "resnet101") return {true, {3, 4, 23, 3}, 64, planes};
  if (arch == "resnet152") return {true, {3, 8, 36, 3}, 64, planes};
  if (arch == "wide_resnet50_2") return {true, {3, 4, 6, 3}, 64, planes, 1, 128};
  if (arch == "resnext50_32x4d") return {true, {3, 4, 6, 3}, 64, planes, 32, 4};
  // A miniature BasicBlock ResNet with the same topology, for fast tests.
  if (arch == "resnet_tiny") return {false, {1, 1, 1, 1}, 8, {8, 16, 32, 64}};
  throw UsageError("unknown architecture '" + arch +
                   "' (expected resnet18, resnet34, resnet50, resnet101, resnet152, wide_resnet50_2, "
                   "resnext50_32x4d or resnet_tiny)");
}

}  // namespace

void validate_arch(const std::string& arch) { (void)arch_spec(arch); }

HeadKind parse_head(const std::string& head) {
  if (head == "fc") return HeadKind::Fc;
  if (head == "mlp") return HeadKind::Mlp;
  throw UsageError("unknown head '" + head + "' (expected mlp or fc)");
}

const char* head_name(HeadKind h) { return h == HeadKind::Fc ? "fc" : "mlp"; }

int64_t torchvision_param_count(const std::string& arch) {
  if (arch == "resnet18") return 11689512;
  if (arch == "resnet34") return 21797672;
  if (arch == "resnet50") return 25557032;
  if (arch == "resnet101") return 44549160;
  if (arch == "resnet152") return 60192808;
  if (arch == "wide_resnet50_2") return 68883240;
  if (arch == "resnext50_32x4d") return 25028904;
  return -1;
}

namespace nn {

// Shared storage for activation gradients during backward (see Block::backward).
struct GradBuffers {
  Tensor p, q, r, u;
};

// The largest activation one of those buffers holds in a backward pass, noted during the
// forward. The buffers are sized for it before the pass: one grown midway would leave the
// layers behind it holding views of the old storage, freed only when the next pass
// rebinds them, and memory freed in the second step keeps CUDA graphs (which need a step
// that allocates and frees nothing) from recording until the fourth.
struct GradNeed {
  Shape shape{};
  Layout layout = Layout::NCHW;
  int64_t elems = 0;
  void note(const Tensor& t) {
    if (t.storage_elems() <= elems) return;
    elems = t.storage_elems();
    shape = t.shape;
    layout = t.layout;
  }
  void reserve(Backend& be, Tensor& buf) const {
    if (elems) ensure_tensor(be, buf, shape, layout);
  }
};

// A residual block: main path + optional downsample (1x1 conv + BN) + add + ReLU.
class Block {
 public:
  Block(Arena& p, Arena& b, const std::string& name, const ArchSpec& spec, int in_ch, int width,
        int stride) {
    const bool bottleneck = spec.bottleneck;
    const int out_ch = bottleneck ? width * 4 : width;
    if (bottleneck) {
      // torchvision's Bottleneck (v1.5): the stride sits on the 3x3 conv, which is
      // also the grouped one (ResNeXt).
      const int inner = width * spec.width_per_group / 64 * spec.groups;
      convs_.emplace_back(p, name + ".conv1", in_ch, inner, 1, 1, 0);
      bns_.emplace_back(p, b, name + ".bn1", inner, true);
      convs_.emplace_back(p, name + ".conv2", inner, inner, 3, stride, 1, spec.groups);
      bns_.emplace_back(p, b, name + ".bn2", inner, true);
      convs_.emplace_back(p, name + ".conv3", inner, out_ch, 1, 1, 0);
      bns_.emplace_back(p, b, name + ".bn3", out_ch, false);
    } else {
      convs_.emplace_back(p, name + ".conv1", in_ch, width, 3, stride, 1);
      bns_.emplace_back(p, b, name + ".bn1", width, true);
      convs_.emplace_back(p, name + ".conv2", width, width, 3, 1, 1);
      bns_.emplace_back(p, b, name + ".bn2", width, false);
    }
    if (stride != 1 || in_ch != out_ch) {
      down_conv_ = std::make_unique<Conv2d>(p, name + ".downsample.0", in_ch, out_ch, 1, stride, 0);
      down_bn_ = std::make_unique<BatchNorm2d>(p, b, name + ".downsample.1", out_ch, false);
    }
    out_channels = out_ch;
  }

  void init(Backend& be, Arena& p, Arena& b, uint64_t& seed) {
    for (auto& c : convs_) c.init(be, p, seed++);
    for (auto& n : bns_) n.init(be, p, b);
    if (down_conv_) {
      down_conv_->init(be, p, seed++);
      down_bn_->init(be, p, b);
    }
  }

  const Tensor& forward(LayerContext& ctx, const Tensor& x) {
    const Tensor* h = &x;
    for (size_t i = 0; i < convs_.size(); ++i) {
      h = &convs_[i].forward(ctx, *h);
      h = &bns_[i].forward(ctx, *h);
    }
    const Tensor* identity = &x;
    if (down_conv_) identity = &down_bn_->forward(ctx, down_conv_->forward(ctx, x));
    nn::ensure_tensor(*ctx.backend, out_, h->shape, h->layout);
    ctx.backend->add_forward(*h, *identity, true, out_);
    return out_;
  }

  // Backward through the block with four shared gradient buffers: `dout` is read
  // once (by the add) and may live in P; the add's gradient goes to Q and stays
  // until the end (both branches read it); batch norms write R, convolutions P, so
  // every op reads one buffer and writes another; the downsample's input gradient
  // waits in U. The block's input gradient ends in P, where the block before it
  // expects its own `dout`.
  const Tensor& backward(LayerContext& ctx, const Tensor& dout, GradBuffers& buf) {
    nn::place_grad(*ctx.backend, dsum_, dout.shape, dout.layout, &buf.q);
    ctx.backend->add_backward(out_, dout, true, dsum_);
    const Tensor* d_identity = &dsum_;
    if (down_conv_)
      d_identity = &down_conv_->backward(ctx, down_bn_->backward(ctx, dsum_, &buf.r), true, &buf.u);
    const Tensor* g = &dsum_;
    for (size_t i = convs_.size(); i-- > 0;) {
      g = &bns_[i].backward(ctx, *g, &buf.r);
      g = &convs_[i].backward(ctx, *g, true, &buf.p);
    }
    // conv1's input gradient (in P) becomes the block's: add the identity path.
    Tensor& dx = const_cast<Tensor&>(*g);
    ctx.backend->accumulate(*d_identity, dx);
    return dx;
  }

  // Plans the block's convolutions for an (n, in_ch, h, w) input; h and w become the output's.
  void plan(Backend& be, int64_t n, int64_t& h, int64_t& w, bool training) const {
    int64_t dh = h, dw = w;
    for (const Conv2d& c : convs_) c.plan(be, n, h, w, training, true);
    if (down_conv_) down_conv_->plan(be, n, dh, dw, training, true);
  }

  int out_channels = 0;
  bool has_downsample() const { return down_conv_ != nullptr; }

 private:
  std::vector<Conv2d> convs_;
  std::vector<BatchNorm2d> bns_;
  std::unique_ptr<Conv2d> down_conv_;
  std::unique_ptr<BatchNorm2d> down_bn_;
  Tensor out_, dsum_;
};

}  // namespace nn

struct ResNet::Impl {
  Backend* backend;
  ResNetConfig cfg;
  Arena params, grads, buffers;
  int64_t num_batches_tracked = 0;
  bool training = true;
  ChannelReducer* reducer = nullptr;
  bool keep_input_grad = false;

  std::unique_ptr<nn::Conv2d> conv1;
  std::unique_ptr<nn::BatchNorm2d> bn1;
  nn::MaxPool2d maxpool{3, 2, 1};
  std::vector<std::unique_ptr<nn::Block>> blocks;
  nn::GlobalAvgPool avgpool;
  std::unique_ptr<nn::Linear> fc0, fc2;  // fc0 is `fc` for the plain head
  nn::ReLU head_relu;

  Tensor input;
  nn::GradBuffers grad_buffers;
  // P and R hold any activation's gradient, Q a block's output's, U a downsampling
  // block's input's (Block::backward).
  nn::GradNeed any_grad, block_out_grad, down_in_grad;
  const Tensor* logits = nullptr;
  Tensor input_grad;

  nn::LayerContext context(BackwardHooks* hooks, bool accumulate) {
    nn::LayerContext ctx;
    ctx.backend = backend;
    ctx.params = &params;
    ctx.grads = &grads;
    ctx.buffers = &buffers;
    ctx.training = training;
    ctx.bn_reducer = reducer;
    ctx.hooks = hooks;
    ctx.accumulate = accumulate;
    return ctx;
  }
};

ResNet::ResNet(Backend& backend, const ResNetConfig& cfg) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.backend = &backend;
  m.cfg = cfg;
  RD_CHECK(cfg.num_classes >= 1, "ResNet: num_classes must be >= 1, got " << cfg.num_classes);
  const ArchSpec spec = arch_spec(cfg.arch);
  Arena& p = m.params;
  Arena& b = m.buffers;
  m.conv1 = std::make_unique<nn::Conv2d>(p, "conv1", 3, spec.stem_width, 7, 2, 3);
  m.bn1 = std::make_unique<nn::BatchNorm2d>(p, b, "bn1", spec.stem_width, true);
  int in_ch = spec.stem_width;
  for (size_t stage = 0; stage < spec.blocks.size(); ++stage) {
    for (int i = 0; i < spec.blocks[stage]; ++i) {
      const int stride = (stage > 0 && i == 0) ? 2 : 1;
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(i);
      m.blocks.push_back(std::make_unique<nn::Block>(p, b, name, spec, in_ch, spec.widths[stage], stride));
      in_ch = m.blocks.back()->out_channels;
    }
  }
  if (cfg.head == HeadKind::Fc) {
    m.fc0 = std::make_unique<nn::Linear>(p, "fc", in_ch, cfg.num_classes);
  } else {
    m.fc0 = std::make_unique<nn::Linear>(p, "fc.0", in_ch, in_ch);
    m.fc2 = std::make_unique<nn::Linear>(p, "fc.2", in_ch, cfg.num_classes);
  }
  // Gradients share the parameter slices' names and offsets.
  for (const ParamSlice& s : p.slices()) m.grads.add(s.name, s.shape);
  m.params.allocate(backend);
  m.grads.allocate(backend);
  m.buffers.allocate(backend);
  init_parameters(cfg.init_seed);
}

ResNet::~ResNet() = default;

const ResNetConfig& ResNet::config() const { return impl_->cfg; }
Backend& ResNet::backend() { return *impl_->backend; }
Arena& ResNet::params() { return impl_->params; }
Arena& ResNet::grads() { return impl_->grads; }
Arena& ResNet::buffers() { return impl_->buffers; }
int64_t ResNet::num_batches_tracked() const { return impl_->num_batches_tracked; }
void ResNet::set_num_batches_tracked(int64_t n) { impl_->num_batches_tracked = n; }
void ResNet::forward_replayed() {
  if (impl_->training) ++impl_->num_batches_tracked;
}
size_t ResNet::num_parameters() const {
  size_t n = 0;
  for (const ParamSlice& s : impl_->params.slices()) n += s.count;
  return n;
}
void ResNet::train(bool on) { impl_->training = on; }
bool ResNet::training() const { return impl_->training; }
void ResNet::set_batchnorm_reducer(ChannelReducer* r) { impl_->reducer = r; }
void ResNet::keep_input_grad(bool on) { impl_->keep_input_grad = on; }
const Tensor& ResNet::input_grad() const { return impl_->input_grad; }

void ResNet::init_parameters(uint64_t seed) {
  Impl& m = *impl_;
  Backend& be = *m.backend;
  // Each layer draws from its own stream so adding a layer never shifts the others.
  uint64_t s = seed * 1000003ull + 17;
  m.conv1->init(be, m.params, s++);
  m.bn1->init(be, m.params, m.buffers);
  for (auto& blk : m.blocks) blk->init(be, m.params, m.buffers, s);
  m.fc0->init(be, m.params, s++);
  if (m.fc2) m.fc2->init(be, m.params, s++);
  m.num_batches_tracked = 0;
}

Tensor& ResNet::input_buffer(int64_t n, int64_t h, int64_t w) {
  nn::ensure_tensor(*impl_->backend, impl_->input, Shape{n, 3, h, w},
                    impl_->backend->layout_for_channels(3));
  return impl_->input;
}

const Tensor& ResNet::forward(const Tensor& x) {
  Impl& m = *impl_;
  RD_CHECK(x.shape.rank == 4 && x.shape[1] == 3,
           "ResNet: input must be (N, 3, H, W), got " << x.describe());
  RD_CHECK(x.shape[2] >= 32 && x.shape[3] >= 32,
           "ResNet: input must be at least 32x32 pixels, got " << x.describe());
  nn::LayerContext ctx = m.context(nullptr, false);
  if (m.training) ++m.num_batches_tracked;
  const Tensor* h = &m.conv1->forward(ctx, x);
  h = &m.bn1->forward(ctx, *h);
  m.any_grad.note(*h);
  h = &m.maxpool.forward(ctx, *h);
  for (auto& blk : m.blocks) {
    if (blk->has_downsample()) m.down_in_grad.note(*h);
    h = &blk->forward(ctx, *h);
    m.any_grad.note(*h);
    m.block_out_grad.note(*h);
  }
  h = &m.avgpool.forward(ctx, *h);
  h = &m.fc0->forward(ctx, *h);
  if (m.fc2) {
    h = &m.head_relu.forward(ctx, *h);
    h = &m.fc2->forward(ctx, *h);
  }
  m.logits = h;
  return *h;
}

void ResNet::plan_convolutions(int64_t n, int64_t h, int64_t w, bool training) {
  Impl& m = *impl_;
  // The stem's input gradient is computed only when kept (gradient checks).
  m.conv1->plan(*m.backend, n, h, w, training, m.keep_input_grad);
  h = m.maxpool.out_size(h);
  w = m.maxpool.out_size(w);
  for (const auto& blk : m.blocks) blk->plan(*m.backend, n, h, w, training);
}

void ResNet::backward(const Tensor& dlogits, bool accumulate, BackwardHooks* hooks) {
  Impl& m = *impl_;
  RD_CHECK(m.logits && m.training, "ResNet::backward needs a training-mode forward first");
  RD_CHECK(dlogits.shape == m.logits->shape, "ResNet::backward: gradient "
                                                 << dlogits.describe() << " does not match logits "
                                                 << m.logits->describe());
  nn::LayerContext ctx = m.context(hooks, accumulate);
  const Tensor* g = &dlogits;
  if (m.fc2) {
    g = &m.fc2->backward(ctx, *g);
    g = &m.head_relu.backward(ctx, *g);
  }
  g = &m.fc0->backward(ctx, *g);
  nn::GradBuffers& buf = m.grad_buffers;
  m.any_grad.reserve(*m.backend, buf.p);
  m.any_grad.reserve(*m.backend, buf.r);
  m.block_out_grad.reserve(*m.backend, buf.q);
  m.down_in_grad.reserve(*m.backend, buf.u);
  g = &m.avgpool.backward(ctx, *g, &buf.p);
  for (size_t i = m.blocks.size(); i-- > 0;) g = &m.blocks[i]->backward(ctx, *g, buf);
  g = &m.maxpool.backward(ctx, *g, &buf.r);
  g = &m.bn1->backward(ctx, *g, &buf.p);
  g = &m.conv1->backward(ctx, *g, m.keep_input_grad);
  if (m.keep_input_grad) m.input_grad = *g;
}

}  // namespace rd
