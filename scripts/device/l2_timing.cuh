// The two device functions the L2 latency probes share (l2_partition_probe.cu, l2_reread_probe.cu).
#pragma once
#include <cstdint>

// The SM's cycle counter.  ptxas moves such a read across straight-line code: time a loop of
// dependent loads (#pragma unroll 1) between two of them, never one load.
__device__ __forceinline__ uint64_t clk() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}

// One 4-byte load cached in the L2 only (not the L1).
__device__ __forceinline__ unsigned ldcg(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
