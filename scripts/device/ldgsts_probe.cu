// What Nsight Compute counts for cp.async (LDGSTS) against plain loads: the question behind
// fwd_fp16_v4's loads measuring 9/8 of the bytes its tiles hold (issue 15).
//
// Each kernel moves the same 64 MiB of global memory (n 16-byte chunks, chunk e by thread e of a
// grid-stride loop, so a warp reads 512 contiguous bytes per instruction) into shared memory,
// 16 bytes a thread, in one of these ways:
//
//   ldg128       ld.global.v4.u32 + st.shared.v4 (plain loads)
//   cp_cg        cp.async.cg.shared.global [s], [g], 16;
//   cp_cg_size   cp.async.cg.shared.global [s], [g], 16, 16;   (src-size operand: the fast kernels' form)
//   cp_cg_zero   cp.async.cg.shared.global [s], [g], 16, 0;    (src-size 0: a zero-filled row)
//   cp_ca        cp.async.ca.shared.global [s], [g], 16;
//   cp_ca_size   cp.async.ca.shared.global [s], [g], 16, 16;
//   pad_cg_size  cp_cg_size into rows of 8 chunks padded to 144 bytes in shared memory (the fast
//                fp16 kernels' layout: row stride d + 8 halves, kernels/perf/fwd_fp16.py:50)
//   pad_cg       cp_cg into the same padded rows
//   pad_ldg128   ldg128 into the same padded rows
//
// If the LSU's load bytes of the pad_* kernels are 9/8 of the others', the counter follows the
// shared-memory destination's 32-byte sectors (a warp's 512 bytes land on 576 bytes of padded
// rows: 18 sectors), which is what fwd_fp16_v4's records show (loads 1.125x its tiles at d = 64,
// every block shape).
//
// then writes one word per block (4 bytes x blocks) so nothing is optimised away.  Built and run
// by scripts/device/ldgsts_probe.sh under ncu; the bytes expected at the LSU are 64 MiB of loads
// for every kernel but cp_cg_zero (whose expected count is the question).
#include <cstdio>
#include <cuda_runtime.h>

#define CHUNKS_PER_BLOCK_ITER 256

template <int MODE>
__global__ void probe(const char* __restrict__ g, long long n, unsigned* out) {
    __shared__ __align__(16) unsigned char sm[CHUNKS_PER_BLOCK_ITER * 18];
    // plain: chunk t at 16·t; padded (MODE >= 6): row t / 8 of 144 bytes, chunk t % 8 in it
    unsigned off = MODE >= 6 ? 144 * (threadIdx.x / 8) + 16 * (threadIdx.x % 8) : 16 * threadIdx.x;
    unsigned s = (unsigned)__cvta_generic_to_shared(sm + off);
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        const char* src = g + 16 * e;
        if (MODE == 0 || MODE == 8) {
            unsigned x, y, z, w;
            asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(src));
            asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" :: "r"(s), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
        } else if (MODE == 1 || MODE == 7) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(src) : "memory");
        } else if (MODE == 2 || MODE == 6) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(16) : "memory");
        } else if (MODE == 3) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(0) : "memory");
        } else if (MODE == 4) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(s), "l"(src) : "memory");
        } else if (MODE == 5) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(src), "r"(16) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = ((unsigned*)sm)[0];
}

int main() {
    const long long bytes = 64ll << 20, n = bytes / 16;
    char* g;
    unsigned* out;
    cudaMalloc(&g, bytes);
    cudaMemset(g, 1, bytes);
    const int blocks = 1024, threads = CHUNKS_PER_BLOCK_ITER;
    cudaMalloc(&out, blocks * sizeof(unsigned));
    probe<0><<<blocks, threads>>>(g, n, out);
    probe<1><<<blocks, threads>>>(g, n, out);
    probe<2><<<blocks, threads>>>(g, n, out);
    probe<3><<<blocks, threads>>>(g, n, out);
    probe<4><<<blocks, threads>>>(g, n, out);
    probe<5><<<blocks, threads>>>(g, n, out);
    probe<6><<<blocks, threads>>>(g, n, out);
    probe<7><<<blocks, threads>>>(g, n, out);
    probe<8><<<blocks, threads>>>(g, n, out);
    cudaError_t err = cudaDeviceSynchronize();
    printf("probe: %s; modes ldg128 cp_cg cp_cg_size cp_cg_zero cp_ca cp_ca_size pad_cg_size pad_cg pad_ldg128, %lld bytes each\n",
           cudaGetErrorString(err), bytes);
    return err != cudaSuccess;
}
