// Which half of the L2 each SM is near, and which half each line lives in (issue 14: the H100
// and H200 split their L2 in two partitions; what does one kernel see of it?).
//
// One thread a block, a few blocks an SM; the blocks take turns (a ticket, then a spin on a
// turn counter), so one SM probes at a time and the others' traffic does not load the L2.
// (The waiting blocks poll the turn every 2 us.)  In its turn a block records its SM (%smid) and, for each line of two sets,
//
//   set 0: LINES consecutive 128-byte lines (the partition hash at fine grain)
//   set 1: LINES lines STRIDE bytes apart (its high address bits)
//
// the cycles (clock64) of HOPS = 16 dependent ld.global.cg (L2, not L1) of the line's first
// word, divided by 16, three times in a row: pass 0, 1, 2.  Every line was read once by the
// first block before any turn (so it is in the L2 and its first miss is not timed).  Each load's
// address adds the previous load's value (zero), and the clocks are read outside the loop of
// loads (ptxas moves a clock read across straight-line code, not across a loop: one load timed
// between two clock reads measured 2-13 cycles).  The first hop's effect (a near copy made by
// it) is 1/16 of pass 0's figure.
//
// If a line's latency depends on the SM (near, far) the SMs split into the partitions' two
// groups and the lines into their homes.  If a far line's pass 1 is as fast as a near one's, a
// read from the far side leaves a copy in the near partition (what halves the capacity a
// kernel sees); if it stays slow, it does not.
//
// With a fourth argument "write", set 1 is *written* by the first block (st.global of zeros)
// instead of read: are lines just written near the SM that wrote them, or, as read lines, in
// their address's half?  (The L2 probes' write_read case, a read-back of what the grid just
// wrote, misses half of it even at 8 MiB.)
//
// Output (binary, little-endian), to the path in argv[1]:
//   "L2PP" magic, u32 version = 2, u32 blocks, u32 lines (per set), u32 stride, u32 sms,
//   i32 clock_khz, u32 write1 (set 1 written), u32 set1_offset (bytes; 0 when read), then per
//   block: u32 smid, u32 rank, then u16 cycles[2 sets][3 passes][lines] (cycles capped at
//   65,535).  Version 1 (analysis/data/l2calib/h200_l2_partition, 774b797) had neither of the two
//   words after clock_khz.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "l2_timing.cuh"

#define LINES 2048
#define LINE 128
#define PASSES 3
#define HOPS 16


__global__ void probe(unsigned* buf, long long stride_words, long long set1_words, int write1, unsigned* tickets,
                      volatile unsigned* turn, unsigned* smids, unsigned short* cycles) {
    __shared__ unsigned sink[4];
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned rank = atomicAdd(tickets, 1u);
    unsigned carry = 0;
    if (rank == 0) {  // warm: every line of both sets read once (set 1's written, with write1)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < LINES; i++) {
                unsigned* a = buf + (s ? set1_words + (long long)i * stride_words : (long long)i * (LINE / 4)) + carry;
                if (s == 1 && write1)
                    asm volatile("st.global.u32 [%0], %1;" ::"l"(a), "r"(0u) : "memory");
                else
                    carry += ldcg(a);
            }
    }
    while (*turn != rank) {
        __nanosleep(2000);  // the waiting blocks' polls kept rare: they reach the L2 too
    }
    __threadfence();
#pragma unroll 1
    for (int s = 0; s < 2; s++) {
#pragma unroll 1
        for (int p = 0; p < PASSES; p++) {
#pragma unroll 1
            for (int i = 0; i < LINES; i++) {
                const unsigned* a = buf + (s ? set1_words + (long long)i * stride_words : (long long)i * (LINE / 4));
                unsigned v = carry;
                uint64_t t0 = clk();
#pragma unroll 1
                for (int k = 0; k < HOPS; k++) v = ldcg(a + v);  // each load's address waits for the last
                uint64_t t1 = clk();
                sink[i & 3] = v;
                carry = v;  // zero
                uint64_t c = (t1 - t0) / HOPS;
                cycles[((size_t)rank * 2 * PASSES + s * PASSES + p) * LINES + i] = c > 65535 ? 65535 : (unsigned short)c;
            }
        }
    }
    // the shared stores are read here, so they stay in the program (and so do the waits for the
    // loads they store, before the clock reads that follow them)
    smids[rank] = (sink[0] | sink[1] | sink[2] | sink[3]) == 0x5a5a5a5au ? 0xffffffffu : smid;
    __threadfence();
    *turn = rank + 1;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: l2_partition_probe OUT.bin [BLOCKS_PER_SM] [STRIDE_BYTES] [read|write]\n");
        return 2;
    }
    int per_sm = argc > 2 ? atoi(argv[2]) : 2;
    long long stride = argc > 3 ? atoll(argv[3]) : 65536;
    // "write": set 1 is written by the first block instead of read, and starts after set 0 (so
    // that no line is in both); "read" (the default) keeps version 1's layout, where set 1's
    // first lines are also set 0's
    int write1 = argc > 4 && argv[4][0] == 'w';
    long long set1_bytes = write1 ? (long long)LINES * LINE : 0;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int clock_khz = 0;
    cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
    unsigned blocks = prop.multiProcessorCount * per_sm;
    size_t bytes = (size_t)stride * LINES + (size_t)LINES * LINE + set1_bytes;
    unsigned *buf, *tickets, *turn, *smids;
    unsigned short* cycles;
    size_t ncyc = (size_t)blocks * 2 * PASSES * LINES;
    if (cudaMalloc(&buf, bytes) || cudaMalloc(&tickets, 4) || cudaMalloc(&turn, 4) ||
        cudaMalloc(&smids, 4 * blocks) || cudaMalloc(&cycles, 2 * ncyc)) {
        fprintf(stderr, "l2_partition_probe: cudaMalloc failed\n");
        return 1;
    }
    cudaMemset(buf, 0, bytes);
    cudaMemset(tickets, 0, 4);
    cudaMemset(turn, 0, 4);
    probe<<<blocks, 1>>>(buf, stride / 4, set1_bytes / 4, write1, tickets, turn, smids, cycles);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "l2_partition_probe: %s\n", cudaGetErrorString(e));
        return 1;
    }
    unsigned* hs = (unsigned*)malloc(4 * blocks);
    unsigned short* hc = (unsigned short*)malloc(2 * ncyc);
    cudaMemcpy(hs, smids, 4 * blocks, cudaMemcpyDeviceToHost);
    cudaMemcpy(hc, cycles, 2 * ncyc, cudaMemcpyDeviceToHost);
    FILE* f = fopen(argv[1], "wb");
    if (!f) {
        fprintf(stderr, "l2_partition_probe: cannot write %s\n", argv[1]);
        return 1;
    }
    unsigned head[8] = {2u, blocks, (unsigned)LINES, (unsigned)stride, (unsigned)prop.multiProcessorCount,
                        (unsigned)clock_khz, (unsigned)write1, (unsigned)set1_bytes};
    fwrite("L2PP", 1, 4, f);
    fwrite(head, 4, 8, f);
    for (unsigned b = 0; b < blocks; b++) {
        unsigned rec[2] = {hs[b], b};
        fwrite(rec, 4, 2, f);
        fwrite(hc + (size_t)b * 2 * PASSES * LINES, 2, 2 * PASSES * LINES, f);
    }
    fclose(f);
    printf("l2_partition_probe: %u blocks (%d SMs), %d lines a set, stride %lld bytes, wrote %s\n", blocks,
           prop.multiProcessorCount, LINES, stride, argv[1]);
    return 0;
}
