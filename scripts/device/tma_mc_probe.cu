// The TMA multicast probe: what do the SMs of a cluster receive (Nsight Compute's
// l1tex__m_xbar2l1tex_read_sectors_mem_global_op_tma_ld{,_dest_multicast,_dest_self}) when the
// CTAs of a cluster each copy a slice of one box and multicast it to all of them, for boxes whose
// rows are not whole sectors or run past the tensor's edge?  A 2-D fp16 tensor of N rows of d
// elements (rows 2d bytes apart); box W columns by 64 rows at column col0; a cluster of c CTAs
// takes box after box (64 rows each, down the tensor), CTA k copying slice k: rows 64k/c.. of
// the box ("rows") or columns col0 + kW/c.. ("cols"), multicast to the whole cluster; c = 1 is
// the plain copy.  One launch a configuration, in the order this program prints them (one line
// each: d W col0 c split launch_index) to stdout; run it under ncu --kernel-name probe.
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/tma_mc_probe scripts/device/tma_mc_probe.cu -lcuda
//   /tmp/tma_mc_probe > manifest.txt
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

static const int N = 4096, BOX_ROWS = 64;

__device__ __forceinline__ unsigned s32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__global__ void probe(const __grid_constant__ CUtensorMap tm, int c, int split, int w, int col0, int boxes)
{
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) unsigned long long bar;
  // the destination 1,024-byte aligned, as the 128-byte swizzle needs
  unsigned char *smem = smem_raw + ((1024 - (s32(smem_raw) & 1023)) & 1023);
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(s32(&bar)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  const int cluster = blockIdx.x / c;
  const unsigned bytes = (unsigned)(w * 2 * BOX_ROWS);
  const unsigned short mask = (unsigned short)((1u << c) - 1);
  unsigned phase = 0;
  for (int i = 0; i < boxes; ++i) {
    const int y = ((cluster * boxes + i) * BOX_ROWS) % N;
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s32(&bar)), "r"(bytes) : "memory");
      int x = col0, yy = y;
      unsigned dst = s32(smem);
      if (c > 1 && split == 0) { yy += (int)rank * (BOX_ROWS / c); dst += rank * (BOX_ROWS / c) * w * 2; }
      if (c > 1 && split == 1) { x += (int)rank * (w / c); dst += rank * BOX_ROWS * (w / c) * 2; }
      if (c == 1)
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                     " [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(dst), "l"(&tm), "r"(x), "r"(yy), "r"(s32(&bar)) : "memory");
      else
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                     " [%0], [%1, {%2, %3}], [%4], %5;"
                     :: "r"(dst), "l"(&tm), "r"(x), "r"(yy), "r"(s32(&bar)), "h"(mask) : "memory");
    }
    // every thread waits for this CTA's whole box (its slice and the others')
    asm volatile("{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra WAIT_%=;\n\t}" :: "r"(s32(&bar)), "r"(phase) : "memory");
    phase ^= 1;
    // no CTA copies the next box into a peer's shared memory before the peer has seen this one
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
}

int main()
{
  void *buf;
  CHECK(cudaMalloc(&buf, (size_t)N * 256 * 2 + 4096));
  CHECK(cudaMemset(buf, 0, (size_t)N * 256 * 2 + 4096));
  CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
  const int ds[] = {16, 32, 48, 64, 72, 80, 96, 112, 128, 144, 160};
  const int ws[] = {64, 32};
  const int cs[] = {1, 2, 4};
  int launch = 0;
  for (int d : ds)
    for (int w : ws)
      for (int col0 = 0; col0 < d; col0 += w)
        for (int c : cs)
          for (int split = 0; split < (c > 1 ? 2 : 1); ++split) {
            const int bw = (c > 1 && split == 1) ? w / c : w;        // the box each CTA copies
            const int br = (c > 1 && split == 0) ? BOX_ROWS / c : BOX_ROWS;
            if (bw * 2 < 16) continue;                               // TMA's 16-byte minimum
            CUtensorMap tm;
            cuuint64_t dims[2] = {(cuuint64_t)d, (cuuint64_t)N};
            cuuint64_t strides[1] = {(cuuint64_t)d * 2};
            cuuint32_t box[2] = {(cuuint32_t)bw, (cuuint32_t)br};
            cuuint32_t estr[2] = {1, 1};
            CUtensorMapSwizzle sw = bw * 2 == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                  : bw * 2 == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                  : bw * 2 == 32 ? CU_TENSOR_MAP_SWIZZLE_32B : CU_TENSOR_MAP_SWIZZLE_NONE;
            CUresult r = cuTensorMapEncodeTiled(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, buf, dims, strides, box, estr,
                                CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
            if (r != CUDA_SUCCESS) { fprintf(stderr, "encode d=%d w=%d c=%d split=%d: %d\n", d, w, c, split, r); continue; }
            const int clusters = N / BOX_ROWS / 4, boxes = 4;      // every box of the tensor once
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(clusters * c);
            cfg.blockDim = dim3(32);
            cfg.dynamicSmemBytes = 33 * 1024;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = c; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
            cfg.attrs = at; cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, probe, tm, c, split, w, col0, boxes));
            CHECK(cudaDeviceSynchronize());
            printf("%d %d %d %d %d %d\n", d, w, col0, c, split, launch++);
          }
  return 0;
}
