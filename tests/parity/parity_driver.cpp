// resnet_ddp side of the PyTorch parity tests (tools/parity/run_parity.py drives it).
//
//   parity_driver --init INIT.h5 --input INPUT.h5 --out OUT.h5
//                 [--train-steps N] [--checkpoint CKPT.h5] [--threads T]
//                 [--layout nhwc|nchw|nchw16c|default]  (CPU activation layout; default: the trainer's for this CPU)
//                 [--conv-algo auto|direct|winograd]  (CPU 3x3 convolution algorithm)
//
// INIT.h5 is a converted torchvision state_dict (docs/checkpoint_format.md).
// INPUT.h5 holds /input float32 (N, 3, H, W), /labels integer (N,) and the root
// attributes label_smoothing and lr. The driver loads the weights into rd::ResNet
// on the CPU backend and writes to OUT.h5:
//   /eval_logits             eval-mode forward of the loaded model
//   /train_logits, loss      train-mode forward, mean label-smoothed cross-entropy
//   /grads/<name>            every parameter gradient of that step
//   /buffers/<name>          BN running stats after that train forward
//   /params_adam1/<name>     parameters after one Adam step (betas 0.9/0.999, eps 1e-8)
//   /final_eval_logits       eval-mode logits after all --train-steps steps (same batch)
//   /relu_masks/<k>          uint8 ReLU decisions of the first train forward, in call
//                            order (see recording_backend.h for why), /maxpool_input
// and, with --checkpoint, the trained model as a checkpoint-format file (for the
// h5 -> .pth -> PyTorch round trip).
#include <hdf5.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "resnet_ddp/io/h5.h"
#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/cpu_isa.h"
#include "resnet_ddp/backend/names.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/nn/resnet.h"
#include "resnet_ddp/train/optimizer.h"
#include "resnet_ddp/train/train_step.h"
#include "recording_backend.h"

namespace {

using H5Id = rd::h5::Id;

bool h5_exists(hid_t loc, const std::string& name) { return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0; }

std::vector<int64_t> dataset_dims(hid_t ds) {
  H5Id space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(rank > 0 ? rank : 0));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// Reads a dataset (converted to `mem_type`) and checks its shape when `expect` is given.
template <class T>
std::vector<T> read_dataset(hid_t file, const std::string& name, hid_t mem_type, const std::string& path,
                            std::vector<int64_t>* dims_out = nullptr, const rd::Shape* expect = nullptr) {
  RD_CHECK(h5_exists(file, name), "'" << path << "' has no dataset " << name);
  H5Id ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  RD_CHECK(ds.ok(), "cannot open " << name << " in '" << path << "'");
  const std::vector<int64_t> dims = dataset_dims(ds.get());
  if (expect) {
    const std::vector<int64_t> want = expect->vec();
    RD_CHECK(dims == want, "'" << path << "' " << name << " has shape " << rd::Shape::from(dims).str()
                               << ", the model needs " << expect->str());
  }
  size_t n = 1;
  for (int64_t d : dims) n *= static_cast<size_t>(d);
  std::vector<T> data(n);
  RD_CHECK(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0,
           "cannot read " << name << " from '" << path << "'");
  if (dims_out) *dims_out = dims;
  return data;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  std::string s;
  const rd::h5::Status st = rd::h5::read_attr(obj, name, s);
  RD_CHECK(st != rd::h5::Status::Missing, "'" << path << "' lacks the root attribute '" << name << "'");
  RD_CHECK(st != rd::h5::Status::WrongType, "'" << path << "' attribute '" << name << "' is not a string");
  RD_CHECK(st == rd::h5::Status::Ok, "cannot read attribute '" << name << "'");
  return s;
}

double read_number_attr(hid_t obj, const char* name, const std::string& path) {
  double v = 0;
  const rd::h5::Status st = rd::h5::read_attr(obj, name, H5T_NATIVE_DOUBLE, v);
  RD_CHECK(st != rd::h5::Status::Missing, "'" << path << "' lacks the root attribute '" << name << "'");
  RD_CHECK(st == rd::h5::Status::Ok, "cannot read attribute '" << name << "'");
  return v;
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.size() + 1);
  H5Tset_strpad(type.get(), H5T_STR_NULLTERM);
  RD_CHECK(rd::h5::write_attr(obj, name, type, type, value.c_str()), "cannot write attribute '" << name << "'");
}

void write_int_attr(hid_t obj, const char* name, int64_t value) {
  RD_CHECK(rd::h5::write_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value),
           "cannot write attribute '" << name << "'");
}

void write_floats(hid_t loc, const std::string& name, const float* data, const std::vector<int64_t>& dims) {
  std::vector<hsize_t> hd(dims.begin(), dims.end());
  H5Id space(hd.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr),
             H5Sclose);
  H5Id ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose);
  RD_CHECK(ds.ok(), "cannot create dataset " << name);
  RD_CHECK(H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
           "cannot write dataset " << name);
}

void write_scalar(hid_t loc, const std::string& name, hid_t file_type, hid_t mem_type, const void* value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id ds(H5Dcreate2(loc, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  RD_CHECK(ds.ok(), "cannot create dataset " << name);
  H5Dwrite(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, value);
}

H5Id create_group(hid_t loc, const char* name) {
  // Creation order tracked so /state_dict lists tensors in state_dict order.
  H5Id gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return H5Id(H5Gcreate2(loc, name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
}

std::vector<float> to_host(rd::Backend& backend, const float* device, size_t count) {
  std::vector<float> host(count);
  backend.copy_to_host(host.data(), device, count * sizeof(float));
  return host;
}

// Every slice of `arena` as a dataset of `group`, in slice (state_dict) order.
void write_arena(rd::Backend& backend, rd::Arena& arena, hid_t group) {
  for (size_t i = 0; i < arena.slices().size(); ++i) {
    const rd::ParamSlice& s = arena.slice(i);
    const std::vector<float> host = to_host(backend, arena.ptr(i), s.count);
    write_floats(group, s.name, host.data(), s.shape.vec());
  }
}

void write_logits(rd::Backend& backend, hid_t file, const std::string& name, const rd::Tensor& logits) {
  const std::vector<float> host = to_host(backend, logits.f32(), static_cast<size_t>(logits.numel()));
  write_floats(file, name, host.data(), logits.shape.vec());
}

void write_masks(const rd::parity::RecordingBackend& rec, hid_t file) {
  H5Id group = create_group(file, "relu_masks");
  for (size_t i = 0; i < rec.relus.size(); ++i) {
    const rd::parity::ReluRecord& r = rec.relus[i];
    char name[32];
    std::snprintf(name, sizeof name, "%04zu", i);
    std::vector<hsize_t> hd(r.dims.begin(), r.dims.end());
    H5Id space(H5Screate_simple(static_cast<int>(hd.size()), hd.data(), nullptr), H5Sclose);
    H5Id ds(H5Dcreate2(group.get(), name, H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            H5Dclose);
    RD_CHECK(ds.ok() && H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, r.kept.data()) >= 0,
             "cannot write relu mask " << name);
    write_string_attr(ds.get(), "kind", r.kind);
  }
  RD_CHECK(!rec.maxpool_dims.empty(), "parity_driver: the forward pass called no max pool");
  write_floats(file, "maxpool_input", rec.maxpool_input.data(), rec.maxpool_dims);
}

struct Args {
  std::string init, input, out, checkpoint;
  int train_steps = 1;
  int threads = 1;
  rd::Layout layout = rd::Layout::NHWC;
  rd::ConvAlgo conv_algo = rd::ConvAlgo::Auto;
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::string layout = "nhwc";
  rd::FlagSet fs("", "parity_driver");
  fs.path("--init", &a.init, "INIT.h5", "converted torchvision state_dict (required)");
  fs.path("--input", &a.input, "INPUT.h5", "batch, labels, label_smoothing and lr (required)");
  fs.path("--out", &a.out, "OUT.h5", "where the results go (required)");
  fs.path("--checkpoint", &a.checkpoint, "CKPT.h5", "also write the trained model as a checkpoint");
  fs.integer("--train-steps", &a.train_steps, 1, "training steps on the batch", 1000);
  fs.integer("--threads", &a.threads, 1, "compute threads", 1000);
  fs.choice("--layout", &layout, {"nhwc", "nchw", "nchw16c", "nchw8c", "default"},
            "CPU activation layout (default: the trainer's for this CPU)");
  fs.enumeration("--conv-algo", &a.conv_algo, rd::conv_algo_names(), "CPU 3x3 convolution algorithm");
  fs.parse_or_help(argc, argv, "Usage: parity_driver --init INIT.h5 --input INPUT.h5 --out OUT.h5 [flags]\n\nFlags:\n");
  if (layout == "default") a.layout = rd::default_cpu_layout(rd::Precision::FP32);  // the trainer's
  for (const auto& [name, value] : rd::layout_names())
    if (name == layout) a.layout = value;
  if (a.init.empty() || a.input.empty() || a.out.empty())
    throw rd::UsageError("--init, --input and --out are required (see parity_driver --help)");
  return a;
}

H5Id open_h5(const std::string& path, const char* flag_name) {
  RD_CHECK(H5Fis_hdf5(path.c_str()) > 0, flag_name << " '" << path << "' is not a readable HDF5 file");
  H5Id f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  RD_CHECK(f.ok(), "cannot open " << flag_name << " '" << path << "'");
  return f;
}

// Loads /state_dict of an init file into the model: every parameter and BN buffer
// must be present with its PyTorch shape.
void load_state_dict(rd::ResNet& model, hid_t file, const std::string& path) {
  rd::Backend& backend = model.backend();
  for (rd::Arena* arena : {&model.params(), &model.buffers()}) {
    for (size_t i = 0; i < arena->slices().size(); ++i) {
      const rd::ParamSlice& s = arena->slice(i);
      const std::vector<float> host =
          read_dataset<float>(file, "state_dict/" + s.name, H5T_NATIVE_FLOAT, path, nullptr, &s.shape);
      backend.copy_from_host(arena->ptr(i), host.data(), s.count * sizeof(float));
    }
  }
  // All BNs count the same batches; torchvision stores one counter per BN.
  const std::vector<int64_t> tracked =
      read_dataset<int64_t>(file, "state_dict/bn1.num_batches_tracked", H5T_NATIVE_INT64, path);
  RD_CHECK(tracked.size() == 1, "'" << path << "' bn1.num_batches_tracked is not a scalar");
  model.set_num_batches_tracked(tracked[0]);
}

void write_checkpoint(rd::ResNet& model, const std::string& path) {
  rd::Backend& backend = model.backend();
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  RD_CHECK(file.ok(), "cannot create --checkpoint '" << path << "'");
  const rd::ResNetConfig& cfg = model.config();
  write_string_attr(file.get(), "format", "resnet_ddp");
  write_int_attr(file.get(), "format_version", 1);
  write_string_attr(file.get(), "arch", cfg.arch);
  write_string_attr(file.get(), "head", rd::head_name(cfg.head));
  write_int_attr(file.get(), "num_classes", cfg.num_classes);
  write_string_attr(file.get(), "created_by", "parity_driver");
  H5Id sd = create_group(file.get(), "state_dict");
  // torchvision's state_dict order: per module, parameters then buffers
  // (running_mean, running_var, num_batches_tracked).
  rd::Arena& params = model.params();
  rd::Arena& buffers = model.buffers();
  const int64_t tracked = model.num_batches_tracked();
  size_t buffers_written = 0;
  auto module_of = [](const std::string& name) { return name.substr(0, name.rfind('.')); };
  for (size_t i = 0; i < params.slices().size(); ++i) {
    const rd::ParamSlice& s = params.slice(i);
    const std::vector<float> host = to_host(backend, params.ptr(i), s.count);
    write_floats(sd.get(), s.name, host.data(), s.shape.vec());
    const std::string module = module_of(s.name);
    if (i + 1 < params.slices().size() && module_of(params.slice(i + 1).name) == module) continue;
    const long mean = buffers.find(module + ".running_mean");
    const long var = buffers.find(module + ".running_var");
    if (mean < 0 || var < 0) continue;  // not a batch norm
    for (long b : {mean, var}) {
      const rd::ParamSlice& bs = buffers.slice(static_cast<size_t>(b));
      const std::vector<float> bh = to_host(backend, buffers.ptr(static_cast<size_t>(b)), bs.count);
      write_floats(sd.get(), bs.name, bh.data(), bs.shape.vec());
      ++buffers_written;
    }
    write_scalar(sd.get(), module + ".num_batches_tracked", H5T_STD_I64LE, H5T_NATIVE_INT64, &tracked);
  }
  RD_CHECK(buffers_written == buffers.slices().size(),
           "parity_driver: " << buffers.slices().size() - buffers_written
                             << " BN buffers have no matching weight/bias in params()");
}

int run(const Args& args) {
  H5Id init = open_h5(args.init, "--init");
  rd::ResNetConfig cfg;
  cfg.arch = read_string_attr(init.get(), "arch", args.init);
  cfg.head = rd::parse_head(read_string_attr(init.get(), "head", args.init));
  cfg.num_classes = static_cast<int>(read_number_attr(init.get(), "num_classes", args.init));

  H5Id input_file = open_h5(args.input, "--input");
  std::vector<int64_t> in_dims;
  const std::vector<float> input =
      read_dataset<float>(input_file.get(), "input", H5T_NATIVE_FLOAT, args.input, &in_dims);
  RD_CHECK(in_dims.size() == 4 && in_dims[1] == 3, "--input '" << args.input << "' /input must be (N, 3, H, W)");
  const int64_t n = in_dims[0], h = in_dims[2], w = in_dims[3];
  std::vector<int64_t> label_dims;
  const std::vector<int32_t> labels =
      read_dataset<int32_t>(input_file.get(), "labels", H5T_NATIVE_INT32, args.input, &label_dims);
  RD_CHECK(label_dims.size() == 1 && label_dims[0] == n, "--input /labels must have shape (" << n << ",)");
  for (int32_t l : labels)
    RD_CHECK(l >= 0 && l < cfg.num_classes, "--input label " << l << " outside [0, " << cfg.num_classes << ")");
  const float smoothing = static_cast<float>(read_number_attr(input_file.get(), "label_smoothing", args.input));
  const float lr = static_cast<float>(read_number_attr(input_file.get(), "lr", args.input));

  rd::BackendOptions bo;
  bo.threads = args.threads;
  bo.layout = args.layout;
  bo.conv_algo = args.conv_algo;
  auto cpu_backend = rd::make_cpu_backend(bo);
  rd::parity::RecordingBackend recorder(*cpu_backend);
  rd::Backend* backend = &recorder;
  rd::ResNet model(*backend, cfg);
  load_state_dict(model, init.get(), args.init);

  H5Id out(H5Fcreate(args.out.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  RD_CHECK(out.ok(), "cannot create --out '" << args.out << "'");
  write_string_attr(out.get(), "backend", backend->name());

  rd::Tensor& x = model.input_buffer(n, h, w);
  backend->copy_from_host_nchw(input.data(), x);

  model.train(false);
  write_logits(*backend, out.get(), "eval_logits", model.forward(x));

  // The trainer's step on one process: Adam with the file's lr (betas 0.9/0.999, eps 1e-8).
  rd::train::OptimizerConfig adam;
  adam.lr = lr;
  rd::train::Optimizer optimizer(*backend, model.params(), model.grads(), adam);
  rd::train::TrainStep train_step(model, optimizer, nullptr, smoothing);

  model.train(true);
  for (int step = 1; step <= args.train_steps; ++step) {
    recorder.recording = step == 1;
    const double loss_sum = train_step.forward(x, labels.data());
    recorder.recording = false;
    train_step.backward_and_reduce();
    if (step == 1) {
      write_logits(*backend, out.get(), "train_logits", train_step.logits());
      const double loss = loss_sum / static_cast<double>(n);
      write_scalar(out.get(), "loss", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &loss);
      H5Id g = create_group(out.get(), "grads");
      write_arena(*backend, model.grads(), g.get());
      H5Id bufs = create_group(out.get(), "buffers");
      write_arena(*backend, model.buffers(), bufs.get());
      write_int_attr(out.get(), "num_batches_tracked_after_step1", model.num_batches_tracked());
      write_masks(recorder, out.get());
    }
    train_step.update();
    if (step == 1) {
      H5Id p = create_group(out.get(), "params_adam1");
      write_arena(*backend, model.params(), p.get());
    }
  }
  model.train(false);
  write_logits(*backend, out.get(), "final_eval_logits", model.forward(x));
  write_int_attr(out.get(), "train_steps", args.train_steps);
  if (!args.checkpoint.empty()) write_checkpoint(model, args.checkpoint);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by RD_CHECK messages instead
  try {
    return run(parse_args(argc, argv));
  } catch (const rd::UsageError& e) {
    std::fprintf(stderr, "parity_driver: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_driver: error: %s\n", e.what());
    return 1;
  }
}
