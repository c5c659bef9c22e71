// Which lines one SM's re-read misses (issue 14): a block of 1,024 threads, so one SM, reads W
// MiB once (16-byte ld.global.cg a thread, coalesced), then its thread 0 times every 16th line
// of the W MiB twice: 16 dependent ld.global.cg of the line's first word (the first of them a
// DRAM access if the line was lost), then 16 more (L2 hits).  The second total divided by 16 is
// the line's hit latency, which says its side from this SM (near about 266 cycles on the H200,
// far about 296: analysis/l2_partition.py); the first total less 15/16 of the second is the
// first load's cycles, a hit's or a miss's (the first total also holds the wait for the last
// line's last load, which the clock read does not wait for: about one hit, the 16th of the
// first loop that its total leaves out).  The question: at W = 32-48 MiB, where the
// calibration's one-SM re-read misses half its lines, are the lost lines the far ones?
//
// Run by PARTS=reread bash scripts/device/l2_partition.sh; read by python -m analysis.l2_partition
// --reread.  Its first run (8ab49da) timed nothing: ptxas drops a load whose value nothing reads,
// asm volatile or not, and the last value was unused (the fix: the condition after the loop;
// check the SASS with nvdisasm -c).  Record: analysis/data/l2calib/h200_l2_reread/ (H200,
// 0aa3913): the first pass keeps the newest 28-29 MiB, near and far lines nearly alike (0.08,
// 0.28, 0.40, 0.56 lost at W = 32, 40, 48, 64; a miss is a first load 40 cycles over its hits).
//
// With "full" or "full-reverse" as the first argument the second pass reads every line (every
// 4th timed; the others one load each, chained), in address order or the reverse, by one block:
// the calibration's one-SM re-read, line by line.  Whether that pass misses in the reverse order
// as much as in address order says whether the L2 gives up its oldest lines (LRU-like: a pass
// in the same order misses all of an overflowing half, in the reverse only what the first pass
// lost) or random ones (both orders alike).
//
// With "written" first the grid writes the W MiB (264 blocks, each a contiguous chunk) instead of
// the worker reading it, and each row names the SM that wrote its line (column writer): the
// calibration's write_read case, whose read-back misses about half of what the grid wrote.
// "written-same" does both in one launch (fill_then_time), as that case does.
//
// With "cold" first there is no first pass: every timed line's first load reads DRAM, which
// gives a miss's cycles on this GPU (the record's cut between hits and misses).
//
// Each W is run four times, by block 0, 1, 2 or 3 of a grid that ends with it (the others leave
// at once), so that the work lands on other SMs, maybe of the other side.  Before each run a
// 512 MiB memset of another buffer, then a read of it by the whole grid, pushes the last run's
// lines out and leaves the L2 clean.
// Output: CSV to stdout, one row per timed line: w_mib,smid,line,first,second (cycles, totals
// of 16 loads).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "l2_timing.cuh"

#define HOPS 16
#define EVERY 16  // time every 16th line
#define FULL_TIMED 4  // "full" modes: every line read, every 4th timed
#define WORKERS 4  // each W run by block 0, 1, 2 and 3, each the last of a grid of worker + 1 blocks


// Reads n words with the whole grid, so that the L2 holds clean lines of another buffer.
__global__ void sweep(const unsigned* __restrict__ p, long long n, unsigned* sink) {
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        acc ^= ldcg(p + i);
    if (acc == 0x5a5a5a5au) *sink = acc;  // never (the buffer holds one repeated byte)
}

// "written" mode: the grid writes the buffer (zeros, 16 bytes a thread), each block a contiguous
// chunk of lines, and records the SM it ran on; the timed pass then reads lines the grid wrote.
__device__ void fill_chunk(unsigned* buf, long long lines, unsigned* writer) {
    long long per = (lines + gridDim.x - 1) / gridDim.x;
    long long lo = blockIdx.x * per, hi = lo + per < lines ? lo + per : lines;
    uint4* b4 = reinterpret_cast<uint4*>(buf);
    for (long long i = lo * 8 + threadIdx.x; i < hi * 8; i += blockDim.x)
        asm volatile("st.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(b4 + i), "r"(0u) : "memory");
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        writer[blockIdx.x] = smid;
    }
}

__global__ void fill(unsigned* buf, long long lines, unsigned* writer) { fill_chunk(buf, lines, writer); }

// Thread 0's timed pass: every ``every``-th line (in address order, or the reverse), each
// ``tstep``-th of them timed (the others read once, out of the timed chain); returns the loads'
// last values, for the caller to use (so that ptxas keeps the loads).
__device__ unsigned timed_pass(const unsigned* __restrict__ buf, long long lines, unsigned* out, int every,
                               int reverse, int tstep, unsigned carry) {
    unsigned untimed = 0;
    long long samples = (lines + every - 1) / every;
#pragma unroll 1
    for (long long k = 0; k < samples; k++) {
        long long s = reverse ? samples - 1 - k : k;  // the timed pass in address order or reversed
        const unsigned* a = buf + s * every * 32;
        if (s % tstep) {  // read, not timed, and kept out of the timed chain (see the first total)
            untimed ^= ldcg(a);
            continue;
        }
        unsigned v = carry;
        uint64_t t0 = clk();
#pragma unroll 1
        for (int k = 0; k < HOPS; k++) v = ldcg(a + v);
        uint64_t t1 = clk();
#pragma unroll 1
        for (int k = 0; k < HOPS; k++) v = ldcg(a + v);
        uint64_t t2 = clk();
        carry = v;
        out[2 * (s / tstep)] = (unsigned)(t1 - t0);
        out[2 * (s / tstep) + 1] = (unsigned)(t2 - t1);
    }
    return carry | untimed;
}

// "written-same" mode: every block writes its chunk, then block 0 waits for all of them (the
// grid is resident at once: 264 blocks of 1,024 threads, two an SM) and times the lines, in the
// same launch, as the calibration's write_read case writes and reads back in one launch.
__global__ void fill_then_time(unsigned* buf, long long lines, unsigned* writer, unsigned* count, unsigned* out,
                               unsigned* smid_out) {
    fill_chunk(buf, lines, writer);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(count, 1u);
    }
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    while (atomicAdd(count, 0u) < gridDim.x) __nanosleep(1000);
    __threadfence();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    *smid_out = smid;
    unsigned last = timed_pass(buf, lines, out, EVERY, 0, 1, 0u);
    if (last == 0x5a5a5a5au) *smid_out = last;
}

// Block ``worker`` alone does the work (the blocks before it leave at once), so that different
// workers can land on different SMs.
__global__ void reread(const unsigned* __restrict__ buf, long long lines, unsigned* out, unsigned* smid_out,
                       int worker, int every, int reverse, int tstep, int warm) {
    if ((int)blockIdx.x != worker) return;
    unsigned acc = 0;
    const uint4* b4 = reinterpret_cast<const uint4*>(buf);
    long long n4 = lines * 8;  // 16-byte chunks
    for (long long i = threadIdx.x; warm && i < n4; i += blockDim.x) {
        uint4 v;
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(b4 + i) : "memory");
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();
    if (threadIdx.x != 0) {
        if (acc == 0x5a5a5a5au) out[0] = acc;  // never (the buffer is zero): keeps the loads
        return;
    }
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    *smid_out = smid;
    unsigned last = timed_pass(buf, lines, out, every, reverse, tstep, acc);  // acc: zero
    // the loads' last value is used, so that ptxas keeps them (a load whose value nothing reads is
    // dropped, asm volatile or not: the first run, at 8ab49da, timed two empty loops, 2 and 6 cycles)
    if (last == 0x5a5a5a5au) *smid_out = last;
}

int main(int argc, char** argv) {
    // "full" / "full-reverse" first: the timed pass reads every line, in address order or the
    // reverse, by block 0 alone (a second full pass, as the calibration's one-SM re-read makes)
    int first_w = 1, every = EVERY, workers = WORKERS, reverse = 0, tstep = 1, warm = 1, written = 0, same = 0;
    if (argc > 1 && strcmp(argv[1], "cold") == 0) {  // no first pass: every timed line a DRAM read
        warm = 0;
        first_w = 2;
    } else if (argc > 1 && strncmp(argv[1], "written", 7) == 0) {  // the grid writes, one SM reads
        warm = 0;
        written = 1;
        same = strcmp(argv[1], "written-same") == 0;  // in the same launch
        first_w = 2;
    } else if (argc > 1 && strncmp(argv[1], "full", 4) == 0) {
        every = 1;
        tstep = FULL_TIMED;
        workers = 1;
        reverse = strcmp(argv[1], "full-reverse") == 0;
        first_w = 2;
    }
    int ws[16], nw = 0;
    for (int i = first_w; i < argc && nw < 16; i++) ws[nw++] = atoi(argv[i]);
    if (nw == 0) {
        fprintf(stderr, "usage: l2_reread_probe [cold|written|written-same|full|full-reverse] W_MIB...\n");
        return 2;
    }
    size_t flush_bytes = (size_t)512 << 20;
    void* flush;
    if (cudaMalloc(&flush, flush_bytes)) return 1;
    printf(written ? "w_mib,smid,line,first,second,writer\n" : "w_mib,smid,line,first,second\n");
    const int fill_blocks = 264;
    unsigned* writer;
    unsigned hw[fill_blocks];
    unsigned* count;
    if (cudaMalloc(&writer, 4 * fill_blocks) || cudaMalloc(&count, 4)) return 1;
    for (int j = 0; j < nw; j++) {
        long long lines = ((long long)ws[j] << 20) / 128;
        long long samples = (lines + every * tstep - 1) / (every * tstep);  // timed lines
        unsigned *buf, *out, *smid;
        if (cudaMalloc(&buf, lines * 128) || cudaMalloc(&out, 8 * samples) || cudaMalloc(&smid, 4)) return 1;
        cudaMemset(buf, 0, lines * 128);
        unsigned* h = (unsigned*)malloc(8 * samples);
        for (int worker = 0; worker < workers; worker++) {
            // push the last run's lines out: 512 MiB written, then read by the whole grid, so
            // the L2 starts with clean lines of the flush buffer
            cudaMemset(flush, j + 1, flush_bytes);
            sweep<<<264, 1024>>>((const unsigned*)flush, flush_bytes / 4, smid);
            if (same) {
                cudaMemset(count, 0, 4);
                fill_then_time<<<fill_blocks, 1024>>>(buf, lines, writer, count, out, smid);
            } else {
                if (written) fill<<<fill_blocks, 1024>>>(buf, lines, writer);
                reread<<<worker + 1, 1024>>>(buf, lines, out, smid, worker, every, reverse, tstep, warm);
            }
            cudaError_t e = cudaDeviceSynchronize();
            if (e != cudaSuccess) {
                fprintf(stderr, "l2_reread_probe: %s\n", cudaGetErrorString(e));
                return 1;
            }
            unsigned hs;
            cudaMemcpy(hw, writer, 4 * fill_blocks, cudaMemcpyDeviceToHost);
            cudaMemcpy(h, out, 8 * samples, cudaMemcpyDeviceToHost);
            cudaMemcpy(&hs, smid, 4, cudaMemcpyDeviceToHost);
            long long per = (lines + fill_blocks - 1) / fill_blocks;  // lines a fill block wrote
            for (long long s = 0; s < samples; s++) {
                long long line = s * every * tstep;
                if (written)
                    printf("%d,%u,%lld,%u,%u,%u\n", ws[j], hs, line, h[2 * s], h[2 * s + 1], hw[line / per]);
                else
                    printf("%d,%u,%lld,%u,%u\n", ws[j], hs, line, h[2 * s], h[2 * s + 1]);
            }
        }
        free(h);
        cudaFree(buf);
        cudaFree(out);
        cudaFree(smid);
    }
    return 0;
}
