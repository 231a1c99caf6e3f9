// Products with quantized weights, dequantizing in registers: matrix-vector for decode (a few
// columns at once, each weight row read once for all of them), the same for mixture-of-experts
// rows chosen by expert id, and dequantization to f16 (for cuBLAS) or f32 (embedding rows).

#define MMV_MAX 8
#define MMV_WARPS 4

// Decode products over Q4_K and Q8_0 weights read their input quantized to 8 bits per value (as
// upstream's mmvq does): each row of x becomes k signed bytes, then per 32 values the scale d
// and d times the sum of the 32 bytes, the row padded to 16 bytes. Integer dot products of the
// weights' 4-bit values with those bytes replace dequantizing every weight to f32, which left
// the products bound by each lane's chain of instructions.
__host__ __device__ __forceinline__ int xq_stride(int k) { return (k + k / 4 + 15) & ~15; }

// One warp per 32 values of a row: lane l holds value l.
extern "C" __global__ void quantize_x(const float* x, int k, int rows, u8* out) {
    const int chunk = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const int r = blockIdx.y, lane = threadIdx.x % WARP;
    if (chunk >= k / 32 || r >= rows) return;
    const float v = x[(i64)r * k + 32 * chunk + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)rintf(v / d);
    u8* row = out + (i64)r * xq_stride(k);
    row[32 * chunk + lane] = (u8)(signed char)q;
    const float sum = warp_sum((float)q);
    if (lane == 0) ((float2*)(row + k))[chunk] = make_float2(d, d * sum);
}

// Whether decode products over TY read quantized input.
template <int TY>
__device__ __forceinline__ constexpr bool reads_q8() {
    return TY == T_Q4_K || TY == T_Q8_0;
}

// Chunk c (32 values) of the blocks at `blocks` (shared memory; Q4_K blocks 4-byte aligned,
// Q8_0 blocks 2-byte aligned) times the quantized x chunk `xq` with its (scale, scaled sum).
template <int TY>
__device__ __forceinline__ float dot_q8(const u8* blocks, int c, const int* xq, float2 ds) {
    int dot = 0;
    if constexpr (TY == T_Q4_K) {
        const u8* b = blocks + (c / 8) * 144;
        const int j = c % 8;
        const u32 dd = *(const u32*)b;
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const u32* q = (const u32*)(b + 16 + 32 * (j / 2));
        const int sh = 4 * (j % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) dot = __dp4a((int)((q[i] >> sh) & 0x0F0F0F0Fu), xq[i], dot);
        return h2f(dd & 0xFFFF) * sc * ds.x * (float)dot - h2f(dd >> 16) * m * ds.y;
    } else {
        const u16* h = (const u16*)(blocks + c * 34);
#pragma unroll
        for (int i = 0; i < 8; i++)
            dot = __dp4a((int)(h[1 + 2 * i] | ((u32)h[2 + 2 * i] << 16)), xq[i], dot);
        return h2f(h[0]) * ds.x * (float)dot;
    }
}

// The products read weights in spans: up to `chunks` 32-element chunks of one row (about 2 KiB
// of blocks, so the rows of most matrices are one span), copied into shared memory with
// asynchronous 16-byte copies while the warp computes the span before.
template <int TY>
struct Span {
    static const int per = Fmt<TY>::elems / 32;
    static const int b32 = WARP / per * Fmt<TY>::bytes;  // bytes of 32 chunks
    static const int chunks = b32 <= 576 ? 128 : b32 <= 1152 ? 64 : 32;
    // the span's blocks plus up to 15 bytes before them (16-byte copies start aligned) and
    // the last copy's overrun
    static const int words = (chunks / per * Fmt<TY>::bytes + 32) / 4;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* global) {
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Starts copying `bytes` from `src` into `buf` (16-byte aligned) as one group; the data starts
// at byte (src & 15) of `buf`. The copies begin at the 16-byte boundary at or before `src` and
// may end up to 15 bytes past its end, inside the same 16-byte granule of the allocation.
__device__ __forceinline__ void span_copy(const u8* src, int bytes, u32* buf) {
    const int o = (int)((unsigned long long)src & 15);
    const u8* a = src - o;
    const int n16 = (o + bytes + 15) / 16;
    for (int i = threadIdx.x % WARP; i < n16; i += WARP) cp_async16(buf + 4 * i, a + 16 * i);
    cp_async_commit();
}

// One warp's dot products: items j0, j0 + 1, ... < j1, each the row `row(j, m)` of each of the
// M matrices times NC-or-fewer input columns (`xrow(j)`, `x_stride` apart), handed to
// `done(j, sums)` with sums[m][col]. Weights are read a span at a time, the next span's copy in
// flight while this one is computed; each lane takes chunks lane, lane + 32, ... of a span, so
// every sum adds the same terms in the same order as a plain loop over the row's chunks.
template <int TY, int M, typename Row, typename XRow, typename Done>
__device__ __forceinline__ void mmv_warp(int j0, int j1, int k, int ncols, i64 x_stride,
                                         Row row, XRow xrow, Done done,
                                         u32 (*buf)[Span<TY>::words]) {
    const int lane = threadIdx.x % WARP;
    const int per = Span<TY>::per, S = Span<TY>::chunks;
    const int chunks = k / 32, ns = (chunks + S - 1) / S;
    const int per_item = M * ns;
    const int total = (j1 > j0 ? j1 - j0 : 0) * per_item;
    auto src = [&](int t, int* c0, int* n) {
        const int rest = t % per_item, m = rest / ns;
        *c0 = rest % ns * S;
        *n = min(S, chunks - *c0);
        return row(j0 + t / per_item, m) + (i64)(*c0 / per) * Fmt<TY>::bytes;
    };
    float acc[M][MMV_MAX];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int col = 0; col < MMV_MAX; col++) acc[m][col] = 0.0f;
    if (total > 0) {
        int c0, n;
        const u8* p = src(0, &c0, &n);
        span_copy(p, n / per * Fmt<TY>::bytes, buf[0]);
    }
    for (int t = 0; t < total; t++) {
        int c0, n;
        if (t + 1 < total) {
            const u8* p = src(t + 1, &c0, &n);
            span_copy(p, n / per * Fmt<TY>::bytes, buf[(t + 1) & 1]);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        const u8* p = src(t, &c0, &n);
        const u8* blocks = (const u8*)buf[t & 1] + ((unsigned long long)p & 15);
        const int j = j0 + t / per_item, m = t % per_item / ns;
        const float* x = xrow(j);
        for (int c = lane; c < n; c += WARP) {
            if constexpr (reads_q8<TY>()) {
                // x holds quantized rows (see quantize_x), x_stride bytes apart
#pragma unroll
                for (int col = 0; col < MMV_MAX; col++) {
                    if (col < ncols) {
                        const u8* xr = (const u8*)x + col * x_stride;
                        const int cx = c0 + c;
                        const int4* xv = (const int4*)(xr + 32 * cx);
                        const int4 a = xv[0], b2 = xv[1];
                        const int xq[8] = {a.x, a.y, a.z, a.w, b2.x, b2.y, b2.z, b2.w};
                        const float2 ds = ((const float2*)(xr + k))[cx];
                        const float s = dot_q8<TY>(blocks, c, xq, ds);
#pragma unroll
                        for (int mm = 0; mm < M; mm++)
                            if (mm == m) acc[mm][col] += s;
                    }
                }
                continue;
            }
            float v[32];
            deq<TY>(blocks, c, v);
#pragma unroll
            for (int col = 0; col < MMV_MAX; col++) {
                if (col < ncols) {
                    const float4* xc = (const float4*)(x + col * x_stride + 32 * (c0 + c));
                    float s = 0.0f;
#pragma unroll
                    for (int l = 0; l < 8; l++) {
                        float4 xv = xc[l];
                        s += v[4 * l] * xv.x + v[4 * l + 1] * xv.y + v[4 * l + 2] * xv.z +
                             v[4 * l + 3] * xv.w;
                    }
                    // constant indices keep acc in registers
#pragma unroll
                    for (int mm = 0; mm < M; mm++)
                        if (mm == m) acc[mm][col] += s;
                }
            }
        }
        __syncwarp();  // every lane is done with this buffer before it is refilled
        if (t % per_item == per_item - 1) {
            float sums[M][MMV_MAX];
#pragma unroll
            for (int mm = 0; mm < M; mm++)
#pragma unroll
                for (int col = 0; col < MMV_MAX; col++) {
                    sums[mm][col] = col < ncols ? warp_sum(acc[mm][col]) : 0.0f;
                    acc[mm][col] = 0.0f;
                }
            if (lane == 0) done(j, sums);
        }
    }
}

// Row i of the products' input: f32 rows of k values, or quantized rows (reads_q8).
template <int TY>
__device__ __forceinline__ const float* x_row(const float* x, int i, int k) {
    if constexpr (reads_q8<TY>()) return (const float*)((const u8*)x + (i64)i * xq_stride(k));
    return x + (i64)i * k;
}

// This warp's rows: `rpw` consecutive rows from (block, warp).
__device__ __forceinline__ int warp_row0(int rpw) {
    return (blockIdx.x * MMV_WARPS + threadIdx.x / WARP) * rpw;
}

template <int TY>
__device__ __forceinline__ void mmv_impl(const u8* W, i64 row_bytes, int k, int nrows,
                                         const float* x, int ncols, float* y, int rpw) {
    __shared__ __align__(16) u32 buf[MMV_WARPS][2][Span<TY>::words];
    const int r0 = warp_row0(rpw);
    // quantized input (quantize_x) has rows xq_stride(k) bytes apart
    const i64 x_stride = reads_q8<TY>() ? xq_stride(k) : k;
    mmv_warp<TY, 1>(
        r0, min(r0 + rpw, nrows), k, ncols, x_stride,
        [&](int r, int) { return W + r * row_bytes; },
        [&](int) { return x; },
        [&](int r, float (*s)[MMV_MAX]) {
            for (int col = 0; col < ncols; col++) y[(i64)col * nrows + r] = s[0][col];
        },
        buf[threadIdx.x / WARP]);
}

// Row r of expert ids[p] times x row (p / x_div): x_div is the experts used per token when all
// of a token's experts read the same input (gate, up), 1 when each has its own (down). A negative
// id is an expert computed elsewhere (on the host): its output row is left as it is.
template <int TY>
__device__ __forceinline__ void mmv_id_impl(const u8* W, i64 row_bytes, i64 expert_bytes, int k,
                                            int nrows, const int* ids, const float* x, int x_div,
                                            float* y, int rpw) {
    __shared__ __align__(16) u32 buf[MMV_WARPS][2][Span<TY>::words];
    const int p = blockIdx.y;
    const int id = ids[p];
    if (id < 0) return;
    const u8* we = W + (i64)id * expert_bytes;
    const float* xp = x_row<TY>(x, p / x_div, k);
    const int r0 = warp_row0(rpw);
    mmv_warp<TY, 1>(
        r0, min(r0 + rpw, nrows), k, 1, k, [&](int r, int) { return we + r * row_bytes; },
        [&](int) { return xp; },
        [&](int r, float (*s)[MMV_MAX]) { y[(i64)p * nrows + r] = s[0][0]; },
        buf[threadIdx.x / WARP]);
}

// The gate and up rows r of expert ids[p] times x row (p / x_div) in one pass, written as
// act(gate) * up: the same sums as two mmv_id products and a glu, in a third of the launches.
template <int TY>
__device__ __forceinline__ void mmv_id_glu_impl(const u8* G, const u8* U, i64 row_bytes,
                                                i64 expert_bytes, int k, int nrows,
                                                const int* ids, const float* x, int x_div,
                                                int gelu, float* y, int rpw) {
    __shared__ __align__(16) u32 buf[MMV_WARPS][2][Span<TY>::words];
    const int p = blockIdx.y;
    const int id = ids[p];
    if (id < 0) return;
    const i64 e0 = (i64)id * expert_bytes;
    const float* xp = x_row<TY>(x, p / x_div, k);
    const int r0 = warp_row0(rpw);
    mmv_warp<TY, 2>(
        r0, min(r0 + rpw, nrows), k, 1, k,
        [&](int r, int m) { return (m == 0 ? G : U) + e0 + r * row_bytes; },
        [&](int) { return xp; },
        [&](int r, float (*s)[MMV_MAX]) {
            y[(i64)p * nrows + r] = glu_of(s[0][0], s[1][0], gelu);
        },
        buf[threadIdx.x / WARP]);
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
                                          const float* x, int ncols, float* y, int rpw) {       \
        mmv_impl<TY>(W, row_bytes, k, nrows, x, ncols, y, rpw);                                 \
    }                                                                                           \
    extern "C" __global__ void mmv_id_##NAME(const u8* W, i64 row_bytes, i64 expert_bytes,     \
                                             int k, int nrows, const int* ids, const float* x,  \
                                             int x_div, float* y, int rpw) {                    \
        mmv_id_impl<TY>(W, row_bytes, expert_bytes, k, nrows, ids, x, x_div, y, rpw);           \
    }                                                                                           \
    extern "C" __global__ void mmv_id_glu_##NAME(const u8* G, const u8* U, i64 row_bytes,      \
                                                 i64 expert_bytes, int k, int nrows,            \
                                                 const int* ids, const float* x, int x_div,     \
                                                 int gelu, float* y, int rpw) {                 \
        mmv_id_glu_impl<TY>(G, U, row_bytes, expert_bytes, k, nrows, ids, x, x_div, gelu, y,    \
                            rpw);                                                               \
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
