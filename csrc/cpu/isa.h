// Instruction-set variants of the hot CPU kernels (every csrc/cpu/*.cpp that includes simd.h:
// preimage.cpp, preimage_span.cpp, kmeans.cpp, rbf.cpp). A portable build (the default on x86-64)
// compiles each of them three times into one library: as is for baseline x86-64 (SSE2), and for
// AVX2+FMA and AVX-512F through six-line translation units that setup.py generates
// (variant_sources: build/geomkern_variants/<kernel>_<isa>.cpp). isa.cpp picks one at load from
// what the CPU reports (gk.cpu_isa() names it).
// GEOMKERN_NATIVE_ARCH=1 (setup.py: -march=native) and non-x86 builds hold one variant, the
// compiler's own target.
//
// A variant differs only by the target of its kernel code (`#pragma GCC target`, set where simd.h
// is included) and by its namespace, geomkern::GEOMKERN_ISA_NS. Every external header (the C++
// library, ATen) must be included before simd.h: an inline function compiled under the pragma
// would be emitted as a weak symbol with AVX code, and the linker could keep that copy for
// baseline callers (tests/test_packaging.py checks that only variant code uses AVX).
#pragma once

#if defined(__x86_64__) && !defined(GEOMKERN_NATIVE_ARCH)
#define GEOMKERN_ISA_VARIANTS 1
#else
#define GEOMKERN_ISA_VARIANTS 0
#endif
