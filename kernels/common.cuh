// Shared definitions for every kernel: fixed-width types (NVRTC has no standard headers),
// half/bfloat conversions through PTX, and warp reductions.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define WARP 32
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Little-endian reads at any alignment (quantized blocks are often only 2-byte aligned).
__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// Bytes per row of decode products' 8-bit input (quantize_x in matvec.cu): k signed bytes, then
// per 32 values a float2 (scale, scale times the sum of the 32 bytes), padded to 16 bytes.
__host__ __device__ __forceinline__ int xq_stride(int k) { return (k + k / 4 + 15) & ~15; }

// act(g) * u for gated FFNs: SiLU (gelu = 0) or GELU's tanh form (gelu = 1).
__device__ __forceinline__ float glu_of(float g, float u, int gelu) {
    const float a = gelu ? 0.5f * g * (1.0f + tanhf(0.7978845608f * g * (1.0f + 0.044715f * g * g)))
                         : g / (1.0f + expf(-g));
    return a * u;
}

// Programmatic dependent launch (sm_90 and newer). With it the host launches kernels so that
// the next kernel on the stream may be scheduled before this one ends; `griddepcontrol.wait` then
// holds a kernel until the grids before it have finished and their writes are visible. Every
// kernel calls grid_sync() before it touches memory an earlier kernel writes or reads (weights,
// which no kernel writes, may be prefetched before it); it then lets the next kernel launch, so
// that kernel's blocks are resident, and its weight prefetches issued, while this one runs.
// Without the launch attribute (older cards; on sm_90 unless BLOOMERY_PDL=1) both return at once.
__device__ __forceinline__ void grid_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for the 32-byte sector holding `p` to be brought into L2 (weights the kernel will read
// once the grids before it are done).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
