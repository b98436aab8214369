// Opens the instruction-set region of a kernel translation unit (csrc/cpu/isa.h): from here to the
// end of the file, functions compile for GEOMKERN_ISA's target, and GEOMKERN_VEC_BYTES is the
// vector width simd.h uses. (g++ does not redefine __AVX2__ or __AVX512F__ after a target pragma,
// so the width is set here, not read from those macros.) Included by simd.h only, after every
// external header.
#pragma once

// GEOMKERN_ISA: 1 AVX2+FMA, 2 AVX-512F (defined by the variant translation units setup.py generates
// before they include a kernel source); undefined: the compiler's target (the baseline variant).
#if GEOMKERN_ISA == 2
#pragma GCC target("avx512f,avx2,fma")
#define GEOMKERN_ISA_NS isa_avx512f
#define GEOMKERN_VEC_BYTES 64
#elif GEOMKERN_ISA == 1
#pragma GCC target("avx2,fma")
#define GEOMKERN_ISA_NS isa_avx2
#define GEOMKERN_VEC_BYTES 32
#else
#define GEOMKERN_ISA_NS isa_base
#if defined(__AVX512F__)
#define GEOMKERN_VEC_BYTES 64
#elif defined(__AVX__)
#define GEOMKERN_VEC_BYTES 32
#else
#define GEOMKERN_VEC_BYTES 16
#endif
#endif
