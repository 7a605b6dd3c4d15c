// message_passing: the point-to-point example of the distributed-training
// tutorial. Rank 0 sends a tensor to every other rank; each side reports it and
// the receiver checks the values (a mismatch exits non-zero).
//
//   mpirun -np 4 ./message_passing [--device cpu|cuda|auto] [--elements N] [--verbose]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "resnet_ddp/backend/backend.h"
#include "resnet_ddp/backend/nccl_comm.h"
#include "resnet_ddp/dist/comm.h"
#include "resnet_ddp/errors.h"
#include "resnet_ddp/flags.h"
#include "resnet_ddp/train/option_types.h"

namespace {

constexpr int kTagData = 1;
constexpr int kTagAck = 2;

using rd::train::Device;

struct Options {
  Device device = Device::Auto;
  size_t elements = 1;
  bool verbose = false;
};

const char* kUsage =
    "usage: message_passing [flags]\n"
    "  Start with mpirun/srun, e.g. mpirun -np 4 ./message_passing\n\nFlags:\n";

// Throws rd::UsageError naming the flag; *help is set by --help.
Options parse(int argc, char** argv, std::string* help) {
  Options o;
  int64_t elements = 1;
  rd::FlagSet fs("", "message_passing");
  fs.enumeration("--device", &o.device,
                 rd::NameTable<Device>{{"cpu", Device::Cpu}, {"cuda", Device::Cuda}, {"auto", Device::Auto}},
            "cpu: MPI over host memory; cuda: NCCL over GPU memory (GPU = local rank); auto: cuda when a GPU "
            "is visible, else cpu");
  fs.integer("--elements", &elements, 1, "floats in the tensor rank 0 sends", int64_t{1} << 31);
  fs.boolean("--verbose", &o.verbose, "print one line per rank (rank, local rank, node, device) first");
  bool want_help = false;
  fs.parse(std::vector<std::string>(argv + 1, argv + argc), false, &want_help);
  if (want_help) *help = kUsage + fs.help();
  o.elements = static_cast<size_t>(elements);
  return o;
}

// The value rank 0 puts at index i of the tensor meant for `dest`: distinct per
// destination, so a message delivered to the wrong rank is caught too.
float expected_value(int dest, size_t i) { return static_cast<float>(dest) + 0.25f * static_cast<float>(i % 1000); }

// Host or device buffer behind the chosen communicator.
struct Buffer {
  std::unique_ptr<rd::Backend> backend;  // only for device memory
  std::shared_ptr<void> device_mem;
  std::vector<float> host;
  float* data = nullptr;

  void upload(const std::vector<float>& v) {
    if (backend) backend->copy_from_host(data, v.data(), v.size() * sizeof(float));
    else host = v, data = host.data();
  }
  std::vector<float> download(size_t n) {
    if (!backend) return host;
    std::vector<float> v(n);
    backend->copy_to_host(v.data(), data, n * sizeof(float));
    return v;
  }
};

// Why this rank cannot use the requested device, or "" when it can.
std::string device_problem(const rd::dist::ProcessEnv& env, bool use_cuda) {
  if (!use_cuda) return "";
#ifdef RESNET_DDP_HAVE_CUDA
  const int gpus = rd::cuda_device_count();
  if (gpus == 0) return "--device cuda: no CUDA device is visible on node " + env.node;
  if (rd::cuda_device_for_rank(env.local_rank, env.local_world, gpus) < 0)
    return "--device cuda: " + std::to_string(env.local_world) + " ranks on node " + env.node +
           " but only " + std::to_string(gpus) + " GPUs (one GPU per rank: start at most " +
           std::to_string(gpus) + " ranks per node, or bind one GPU per task)";
  return "";
#else
  return "--device cuda: this build has no CUDA support (configure with -DRESNET_DDP_CUDA=ON "
         "on a machine with the CUDA toolkit)";
#endif
}

// The communicator and buffer of the chosen device.
struct Channel {
  Buffer buf;
  std::unique_ptr<rd::dist::Comm> comm;
  std::string device_desc = "cpu";
};

// Opens the channel on every rank; false (after saying why) when some rank cannot use
// the device. Device problems can differ between nodes: the ranks agree on the outcome,
// so every one exits 2 cleanly instead of some waiting for peers that gave up.
bool open_channel(const rd::dist::ProcessEnv& env, const Options& opt, rd::dist::Comm& control, Channel& ch) {
  bool use_cuda = opt.device == Device::Cuda;
  if (opt.device == Device::Auto) {
    use_cuda = rd::cuda_backend_available();
    if (!use_cuda && env.rank == 0)
      std::fprintf(stderr, "message_passing: no GPU visible, using MPI over host memory\n");
  }
  const std::string problem = device_problem(env, use_cuda);
  int64_t problems = problem.empty() ? 0 : 1;
  control.allreduce(&problems, 1, rd::dist::ReduceOp::Sum);
  if (problems) {
    if (!problem.empty()) std::fprintf(stderr, "message_passing: rank %d: %s\n", env.rank, problem.c_str());
    return false;
  }
#ifdef RESNET_DDP_HAVE_CUDA
  if (use_cuda) {
    rd::BackendOptions bo;
    bo.device_index = rd::cuda_device_for_rank(env.local_rank, env.local_world, rd::cuda_device_count());
    bo.collective_timeout_s = rd::dist::collective_timeout_s();
    ch.buf.backend = rd::make_cuda_backend(bo);
    ch.buf.device_mem = ch.buf.backend->allocate(opt.elements * sizeof(float));
    ch.buf.data = static_cast<float*>(ch.buf.device_mem.get());
    ch.comm = rd::make_nccl_comm(MPI_COMM_WORLD, *ch.buf.backend);
    ch.device_desc = "cuda:" + std::to_string(bo.device_index);
  }
#endif
  if (!ch.comm) ch.comm = rd::dist::make_mpi_comm(MPI_COMM_WORLD);
  return true;
}

// Rank 0 sends each other rank its tensor and waits for its acknowledgement (so the
// lines alternate as in the tutorial); the receiver checks every value. 1 when some rank
// received wrong data.
int exchange(const rd::dist::ProcessEnv& env, const Options& opt, rd::dist::Comm& control, Channel& ch) {
  const size_t bytes = opt.elements * sizeof(float);
  int mismatches = 0;
  if (env.rank == 0) {
    for (int dest = 1; dest < env.world; ++dest) {
      std::vector<float> v(opt.elements);
      for (size_t i = 0; i < v.size(); ++i) v[i] = expected_value(dest, i);
      ch.buf.upload(v);
      ch.comm->send(ch.buf.data, bytes, dest, kTagData);
      std::printf("worker_%d sent data to Rank %d\n\n", 0, dest);
      std::fflush(stdout);
      int ack = 0;
      control.recv(&ack, sizeof ack, dest, kTagAck);
      mismatches += ack;
    }
  } else {
    std::vector<float> init(opt.elements, -1.0f);
    ch.buf.upload(init);
    ch.comm->recv(ch.buf.data, bytes, 0, kTagData);
    std::vector<float> got = ch.buf.download(opt.elements);
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != expected_value(env.rank, i);
    std::printf("worker_%d has received data from rank %d\n\n", env.rank, 0);
    std::fflush(stdout);
    if (bad) {
      std::fprintf(stderr, "worker_%d: %d of %zu received values differ from what rank 0 sent\n",
                   env.rank, bad, opt.elements);
      mismatches = 1;
    }
    control.send(&mismatches, sizeof mismatches, 0, kTagAck);
  }
  int64_t failed = mismatches ? 1 : 0;
  control.allreduce(&failed, 1, rd::dist::ReduceOp::Sum);
  if (failed && env.rank == 0)
    std::fprintf(stderr, "message_passing: %lld rank(s) received wrong data\n",
                 static_cast<long long>(failed));
  return failed ? 1 : 0;
}

int run(const rd::dist::ProcessEnv& env, const Options& opt) {
  // Acknowledgements and verdicts always travel over MPI.
  auto control = rd::dist::make_mpi_comm(MPI_COMM_WORLD);
  Channel ch;
  if (!open_channel(env, opt, *control, ch)) return 2;
  if (opt.verbose) rd::dist::print_startup_lines(env, ch.device_desc);
  if (env.world == 1) {
    std::fprintf(stderr, "message_passing: only one rank, nothing to send "
                         "(start it with mpirun -np N, N >= 2)\n");
    return 0;
  }
  return exchange(env, opt, *control, ch);
}

}  // namespace

int main(int argc, char** argv) {
  rd::dist::ProcessEnv env;
  try {
    env = rd::dist::init_process(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "message_passing: %s\n", e.what());
    return 2;
  }
  int rc = 0;
  Options opt;
  std::string help;
  try {
    opt = parse(argc, argv, &help);  // every rank parses the same arguments: all agree
  } catch (const rd::UsageError& e) {
    if (env.rank == 0) std::fprintf(stderr, "message_passing: %s\n", e.what());
    rd::dist::finalize_process();
    return 2;
  }
  if (!help.empty()) {
    if (env.rank == 0) std::fputs(help.c_str(), stdout);
    rd::dist::finalize_process();
    return 0;
  }
  try {
    rc = run(env, opt);
  } catch (const std::exception& e) {
    // Peers may be waiting in a collective this rank will never join.
    std::fprintf(stderr, "message_passing: rank %d: %s\n", env.rank, e.what());
    rd::dist::abort_job(1);
  }
  rd::dist::finalize_process();
  return rc;
}
