// The AVX-512F variant of csrc/cpu/kmeans.cpp (csrc/cpu/isa.h: how variants are built and picked).
#include "../isa.h"
#if GEOMKERN_ISA_VARIANTS
#define GEOMKERN_ISA 2
#include "../kmeans.cpp"
#endif
