// Include first in translation units whose floating-point results must match
// PIL/torchvision bit for bit: it forbids fusing a*b+c into one FMA instruction,
// which GCC does by default for C++ when the target has FMA (-march=native).
#pragma once
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
