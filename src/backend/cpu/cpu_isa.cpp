// cpu_isa_defaults(): the CPU backend's layout and algorithm policy per ISA
// (include/resnet_ddp/backend/cpu_isa.h says why each choice).
#include "resnet_ddp/backend/cpu_isa.h"

#include <dnnl.hpp>

namespace rd {

CpuIsaDefaults cpu_isa_defaults() {
  using isa = dnnl::cpu_isa;
  CpuIsaDefaults d;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::avx512_core_amx: d.isa = "avx512_core_amx", d.avx512 = d.bf16 = true; break;
    case isa::avx512_core_bf16:
      d.isa = "avx512_core_bf16", d.avx512 = d.bf16 = d.winograd_in_bf16 = true;
      break;
    case isa::avx512_core_vnni: d.isa = "avx512_core_vnni", d.avx512 = true; break;
    case isa::avx512_core: d.isa = "avx512_core", d.avx512 = true; break;
    case isa::avx2_vnni: d.isa = "avx2_vnni"; break;
    case isa::avx2: d.isa = "avx2"; break;
    case isa::avx: d.isa = "avx"; break;
    case isa::sse41: d.isa = "sse41"; break;
    default: d.isa = "other"; break;  // Xeon Phi (avx512_mic): treated as AVX2-class
  }
  // The blocked layout whose width is the ISA's vector: oneDNN's AVX2 direct kernels
  // on nChw8c are 1.3x faster than on NHWC (ResNet-34@244's convolutions,
  // docs/performance.md).
  d.fp32_layout = d.avx512 ? Layout::NCHW16C : Layout::NCHW8C;
  d.bf16_layout = d.winograd_in_bf16 ? Layout::NCHW16C : Layout::NHWC;
  return d;
}

}  // namespace rd
