// The AVX2+FMA variant of csrc/cpu/rbf.cpp (csrc/cpu/isa.h: how variants are built and picked).
#include "../isa.h"
#if GEOMKERN_ISA_VARIANTS
#define GEOMKERN_ISA 1
#include "../rbf.cpp"
#endif
