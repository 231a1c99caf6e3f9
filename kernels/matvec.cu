// Products with quantized weights, dequantizing in registers: matrix-vector for decode (a few
// columns at once, each weight row read once for all of them), the same for mixture-of-experts
// rows chosen by expert id, and dequantization to f16 (for cuBLAS) or f32 (embedding rows).

#define MMV_MAX 8
#define MMV_WARPS 4

// acc[col] += W_row . x[col] over this lane's 32-element chunks.
template <int TY>
__device__ __forceinline__ void mmv_lane(const u8* w, int k, const float* x, i64 x_stride,
                                         int ncols, float* acc) {
    const int lane = threadIdx.x % WARP;
    float v[32];
    for (int c = lane; c < k / 32; c += WARP) {
        deq<TY>(w, c, v);
#pragma unroll
        for (int col = 0; col < MMV_MAX; col++) {
            if (col < ncols) {
                const float4* xc = (const float4*)(x + col * x_stride + 32 * c);
                float s = 0.0f;
#pragma unroll
                for (int l = 0; l < 8; l++) {
                    float4 xv = xc[l];
                    s += v[4 * l] * xv.x + v[4 * l + 1] * xv.y + v[4 * l + 2] * xv.z +
                         v[4 * l + 3] * xv.w;
                }
                acc[col] += s;
            }
        }
    }
}

template <int TY>
__device__ __forceinline__ void mmv_impl(const u8* W, i64 row_bytes, int k, int nrows,
                                         const float* x, int ncols, float* y) {
    const int r = blockIdx.x * MMV_WARPS + threadIdx.x / WARP;
    if (r >= nrows) return;
    float acc[MMV_MAX];
#pragma unroll
    for (int col = 0; col < MMV_MAX; col++) acc[col] = 0.0f;
    mmv_lane<TY>(W + r * row_bytes, k, x, k, ncols, acc);
#pragma unroll
    for (int col = 0; col < MMV_MAX; col++) {
        if (col < ncols) {
            float s = warp_sum(acc[col]);
            if (threadIdx.x % WARP == 0) y[(i64)col * nrows + r] = s;
        }
    }
}

// Row r of expert ids[p] times x row (p / x_div): x_div is the experts used per token when all
// of a token's experts read the same input (gate, up), 1 when each has its own (down). A negative
// id is an expert computed elsewhere (on the host): its output row is left as it is.
template <int TY>
__device__ __forceinline__ void mmv_id_impl(const u8* W, i64 row_bytes, i64 expert_bytes, int k,
                                            int nrows, const int* ids, const float* x, int x_div,
                                            float* y) {
    const int r = blockIdx.x * MMV_WARPS + threadIdx.x / WARP;
    const int p = blockIdx.y;
    const int id = ids[p];
    if (r >= nrows || id < 0) return;
    float acc[MMV_MAX];
#pragma unroll
    for (int col = 0; col < MMV_MAX; col++) acc[col] = 0.0f;
    const u8* w = W + (i64)id * expert_bytes + r * row_bytes;
    mmv_lane<TY>(w, k, x + (i64)(p / x_div) * k, k, 1, acc);
    float s = warp_sum(acc[0]);
    if (threadIdx.x % WARP == 0) y[(i64)p * nrows + r] = s;
}

// Each thread dequantizes one 32-element chunk; chunks enumerate the output in order, so a
// warp's 32 chunks are 2 KiB of contiguous f16, staged in shared memory and written with 16-byte
// stores (writing each thread's 32 halves directly scatters every store over 32 segments).
// Blocks are 128 threads.
template <int TY>
__device__ __forceinline__ void deq_f16_impl(const u8* W, i64 row_bytes, int k, int nrows,
                                             u16* out) {
    __shared__ __align__(16) u16 stage[4][32 * 32];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const i64 t = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    const int per = k / 32;
    const i64 total = (i64)nrows * per;
    if (t < total) {
        float v[32];
        deq<TY>(W + (t / per) * row_bytes, (int)(t % per), v);
#pragma unroll
        for (int l = 0; l < 32; l++) stage[warp][lane * 32 + l] = f2h(v[l]);
    }
    __syncwarp();
    const i64 t0 = t - lane;
    const uint4* src = (const uint4*)stage[warp];
    uint4* dst = (uint4*)(out + 32 * t0);
#pragma unroll
    for (int i = lane; i < 128; i += WARP)
        if (t0 + i / 4 < total) dst[i] = src[i];
}

template <int TY>
__device__ __forceinline__ void get_rows_impl(const u8* W, i64 row_bytes, int k, const int* ids,
                                              float* out) {
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= k / 32) return;
    float v[32];
    deq<TY>(W + (i64)ids[t] * row_bytes, c, v);
    float* o = out + (i64)t * k + 32 * c;
#pragma unroll
    for (int l = 0; l < 32; l++) o[l] = v[l];
}

#define MATVEC_KERNELS(NAME, TY)                                                                \
    extern "C" __global__ void mmv_##NAME(const u8* W, i64 row_bytes, int k, int nrows,         \
                                          const float* x, int ncols, float* y) {                \
        mmv_impl<TY>(W, row_bytes, k, nrows, x, ncols, y);                                      \
    }                                                                                           \
    extern "C" __global__ void mmv_id_##NAME(const u8* W, i64 row_bytes, i64 expert_bytes,     \
                                             int k, int nrows, const int* ids, const float* x,  \
                                             int x_div, float* y) {                             \
        mmv_id_impl<TY>(W, row_bytes, expert_bytes, k, nrows, ids, x, x_div, y);                \
    }                                                                                           \
    extern "C" __global__ void deq_f16_##NAME(const u8* W, i64 row_bytes, int k, int nrows,     \
                                              u16* out) {                                       \
        deq_f16_impl<TY>(W, row_bytes, k, nrows, out);                                          \
    }                                                                                           \
    extern "C" __global__ void get_rows_##NAME(const u8* W, i64 row_bytes, int k,               \
                                               const int* ids, float* out) {                    \
        get_rows_impl<TY>(W, row_bytes, k, ids, out);                                           \
    }

FOR_EACH_TYPE(MATVEC_KERNELS)
