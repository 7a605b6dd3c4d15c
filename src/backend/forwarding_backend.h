// ForwardingBackend: a Backend that passes every call on to an inner Backend, for
// decorators that watch or time calls (the parity driver's ReLU recorder, the fault
// injector of tests/backend, the per-op profiler in bench/op_profile_bench.cpp)
// without each repeating the list of forwarders. Not part of the public API: only
// those tests and benchmarks use it (they have src/ on their include path).
//
// A subclass either overrides the `*_impl` calls it cares about (and calls the base
// version to forward; the public ops are Backend's contract checks), or overrides
// on_enter/on_exit, which bracket every operation with its BackendOp. The cheap
// queries (device, name, layouts, dtype) are forwarded without hooks: they are not
// operations. The forwarders and BackendOp come from the op list
// (include/resnet_ddp/backend/ops.def), so a new op is forwarded without an edit here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "resnet_ddp/backend/backend.h"

namespace rd {

// One value per Backend operation, in the order of ops.def.
enum class BackendOp : uint8_t {
#define RD_BACKEND_OP(name, ret, params, args, kind) name,
#define RD_BACKEND_VIRTUAL(name, ret, params, args, kind) name,
#include "resnet_ddp/backend/ops.def"
  count_  // number of operations, not an operation
};

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  Backend& inner() { return in_; }

  DeviceKind device() const override { return in_.device(); }
  std::string name() const override { return in_.name(); }
  Layout activation_layout() const override { return in_.activation_layout(); }
  DType activation_dtype() const override { return in_.activation_dtype(); }

#define RD_BACKEND_VIRTUAL(name, ret, params, args, kind) \
  ret name params override {                              \
    Hook hook_(*this, BackendOp::name);                   \
    return in_.name args;                                 \
  }
#include "resnet_ddp/backend/ops.def"

 protected:
  // The contract already ran in the public op of this decorator; the inner
  // backend's public op runs it again (cheap), then its own implementation.
#define RD_BACKEND_OP(name, ret, params, args, kind) \
  ret name##_impl params override {                  \
    Hook hook_(*this, BackendOp::name);              \
    return in_.name args;                            \
  }
#include "resnet_ddp/backend/ops.def"

  // Called around every operation (on_exit after the inner call returned, or threw).
  virtual void on_enter(BackendOp) {}
  virtual void on_exit(BackendOp) {}

 private:
  struct Hook {
    ForwardingBackend& self;
    BackendOp op;
    Hook(ForwardingBackend& s, BackendOp o) : self(s), op(o) { self.on_enter(op); }
    ~Hook() { self.on_exit(op); }
    Hook(const Hook&) = delete;
    Hook& operator=(const Hook&) = delete;
  };

  Backend& in_;
};

}  // namespace rd
