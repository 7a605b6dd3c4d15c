// The CPU backend's ISA policy: which layout and convolution algorithm it runs by
// default on this CPU. Callers only need it to report or override the choice
// (`resnet_ddp check`, the benchmarks); BackendOptions{} already gets it.
#pragma once

#include <string>

#include "resnet_ddp/backend/backend.h"

namespace rd {

// What the CPU backend runs natively on this machine, from the ISA oneDNN reports
// (dnnl::get_effective_cpu_isa(), which honours the DNNL_MAX_CPU_ISA cap). oneDNN 2.6's
// fast kernels differ per ISA, and a layout or algorithm it has no kernel for falls to
// reference code 100x slower (ResNet-34@244 under the AVX2 cap with nChw16c: 3 steps
// > 600 s), so the defaults follow the ISA:
//   AVX-512 (core, VNNI, BF16, AMX): fp32 nChw16c + Winograd 3x3 (no reorders around any
//     convolution). bf16 with AMX: NHWC (oneDNN runs bf16 convolutions on AMX only for
//     NHWC; nChw16c bf16 measured 3.5x slower). bf16 without AMX: nChw16c, and 3x3
//     stride-1 convolutions stay fp32 Winograd (faster than AVX512-BF16 direct).
//   AVX2 and older: nChw8c + direct convolutions (oneDNN's AVX2 kernels are fastest on
//     nChw8c; it has no nChw16c or Winograd kernels there). No bf16 instructions.
struct CpuIsaDefaults {
  std::string isa;         // oneDNN's name for it, e.g. "avx2", "avx512_core_amx"
  bool avx512 = false;     // nChw16c and Winograd run natively
  bool bf16 = false;       // bf16 convolutions run natively (AVX512-BF16 or AMX)
  // bf16 mode keeps fp32 Winograd for 3x3 stride-1 convolutions: true without AMX,
  // where oneDNN's bf16 direct kernels are slower than fp32 Winograd.
  bool winograd_in_bf16 = false;
  Layout fp32_layout = Layout::NHWC;
  Layout bf16_layout = Layout::NHWC;
  Layout layout(Precision p) const { return p == Precision::BF16 ? bf16_layout : fp32_layout; }
};
CpuIsaDefaults cpu_isa_defaults();  // src/backend/cpu (needs oneDNN)
// The CPU activation layout an unset BackendOptions::layout resolves to.
inline Layout default_cpu_layout(Precision p) { return cpu_isa_defaults().layout(p); }

}  // namespace rd
