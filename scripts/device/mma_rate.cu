// The tensor pipe's rate for mma.sync on this GPU: every warp issues ITERS x CHAINS independent
// mma (CHAINS accumulators, so no mma waits on the one before it), one block of W warps an SM.
// Prints, per shape and W, TFLOP/s and the SM cycles per mma per SM sub-partition (the SM clock
// from clock64 in the kernel, the time from CUDA events).  Build and run on the GPU machine:
//
//     nvcc -O3 -arch=sm_90a -o /tmp/mma_rate scripts/device/mma_rate.cu && /tmp/mma_rate
//
// It answers what 3xTF32 kernels are bound by: bwd_fp32_v2 issues m16n8k8 tf32 (2,048 FLOPs),
// the fp16 kernels m16n8k16 f16 (4,096).
#include <cstdio>
#include <cuda_runtime.h>

constexpr int ITERS = 4096;
constexpr int CHAINS = 8;

// One mma of the shape TF32 selects (m16n8k8 tf32, or m16n8k16 f16) into accumulator c.
template <bool TF32>
__device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                    unsigned b1) {
    if constexpr (TF32)
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <bool TF32>
__global__ void rate_k(float* out, long long* cycles) {
    float c[CHAINS][4] = {};
    unsigned a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = a0 * 3, b1 = a0 * 5;
    long long t0 = clock64();
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j) mma<TF32>(c[j], a0, a1, a2, a3, b0, b1);
    }
    long long t1 = clock64();
    float s = 0.f;
    for (int j = 0; j < CHAINS; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float* out;
    long long* cyc;
    cudaMalloc(&out, sms * 1024 * sizeof(float));
    cudaMalloc(&cyc, sms * sizeof(long long));
    long long* hc = new long long[sms];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    printf("shape,warps_per_sm,tflops,cycles_per_mma_per_subpartition,ms\n");
    for (int shape = 0; shape < 2; ++shape) {
        for (int w : {4, 8, 16, 32}) {
            auto k = shape == 0 ? rate_k<true> : rate_k<false>;
            k<<<sms, 32 * w>>>(out, cyc);  // warm-up
            cudaEventRecord(e0);
            k<<<sms, 32 * w>>>(out, cyc);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0.f;
            cudaEventElapsedTime(&ms, e0, e1);
            cudaMemcpy(hc, cyc, sms * sizeof(long long), cudaMemcpyDeviceToHost);
            double cmax = 0;
            for (int i = 0; i < sms; ++i) cmax = hc[i] > cmax ? hc[i] : cmax;
            double mmas = double(sms) * w * ITERS * CHAINS;
            double flops = mmas * (shape == 0 ? 2048.0 : 4096.0);
            // Per sub-partition: w / 4 warps each issuing ITERS x CHAINS mma in cmax cycles.
            double cpm = cmax / (double(w) / 4 * ITERS * CHAINS);
            printf("%s,%d,%.1f,%.2f,%.3f\n", shape == 0 ? "m16n8k8.tf32" : "m16n8k16.f16", w, flops / ms / 1e9,
                   cpm, ms);
        }
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        printf("error: %s\n", cudaGetErrorString(err));
        return 1;
    }
    return 0;
}
