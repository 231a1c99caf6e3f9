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
// (xq_stride, the rows' byte stride, is in common.cuh: rms_norm writes such rows too.)

// One warp per 32 values of a row: lane l holds value l.
extern "C" __global__ void quantize_x(const float* x, int k, int rows, u8* out) {
    grid_sync();
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
// M matrices times NC-or-fewer f32 input columns (`xrow(j)`, `x_stride` floats apart), handed to
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

// Decode products over F32 weights and the types that read quantized input (Q4_K, Q8_0) give
// each row a group of g warps (g = 1, 2 or 4 by the row's length; 4 / g rows to a block of 128
// threads). A row is cut into items of 16 weights; thread t of a group takes items t, t + 32 g,
// ... straight from memory, and the group's sums meet in shared memory. Every row has its own
// threads, so a 512-row matrix still has every multiprocessor's loads in flight, where a warp
// walking whole rows (mmv_warp) left most of the card idle and waited on each span in turn.
template <int TY>
__device__ __forceinline__ constexpr bool grouped() {
    return TY == T_F32 || reads_q8<TY>();
}

template <int TY>
struct Item;

// 8 bytes of a super-block's 4-bit values: 8 values of sub-block 2p (low nibbles) and the same
// 8 positions of sub-block 2p + 1 (high nibbles), against the quantized input.
template <>
struct Item<T_Q4_K> {
    static __device__ __forceinline__ float dot(const u8* row, int i, const u8* xr, int k) {
        const int sb = i / 16, p = i % 16 / 4, q = i % 4;
        const u8* b = row + (i64)sb * 144;
        const u32 dd = *(const u32*)b;
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * p, b + 4, &sc0, &m0);
        scale_min_k4(2 * p + 1, b + 4, &sc1, &m1);
        const uint2 w = *(const uint2*)(b + 16 + 32 * p + 8 * q);
        const int c0 = sb * 8 + 2 * p;
        const uint2 x0 = *(const uint2*)(xr + 32 * c0 + 8 * q);
        const uint2 x1 = *(const uint2*)(xr + 32 * (c0 + 1) + 8 * q);
        const float2* ds = (const float2*)(xr + k);
        const float2 d0 = ds[c0], d1 = ds[c0 + 1];
        int lo = __dp4a((int)(w.x & 0x0F0F0F0Fu), (int)x0.x, 0);
        lo = __dp4a((int)(w.y & 0x0F0F0F0Fu), (int)x0.y, lo);
        int hi = __dp4a((int)((w.x >> 4) & 0x0F0F0F0Fu), (int)x1.x, 0);
        hi = __dp4a((int)((w.y >> 4) & 0x0F0F0F0Fu), (int)x1.y, hi);
        float s = h2f(dd & 0xFFFF) * (sc0 * d0.x * (float)lo + sc1 * d1.x * (float)hi);
        // each sub-block's min term once, by the item holding its first 8 values
        if (q == 0) s -= h2f(dd >> 16) * (m0 * d0.y + m1 * d1.y);
        return s;
    }
};

// Half a block (16 signed bytes, 2-byte aligned) against the quantized input.
template <>
struct Item<T_Q8_0> {
    static __device__ __forceinline__ float dot(const u8* row, int i, const u8* xr, int k) {
        const u8* b = row + (i64)(i / 2) * 34;
        const u16* w = (const u16*)(b + 2 + 16 * (i % 2));
        const int4 x = *(const int4*)(xr + 16 * i);
        int s = __dp4a((int)(w[0] | ((u32)w[1] << 16)), x.x, 0);
        s = __dp4a((int)(w[2] | ((u32)w[3] << 16)), x.y, s);
        s = __dp4a((int)(w[4] | ((u32)w[5] << 16)), x.z, s);
        s = __dp4a((int)(w[6] | ((u32)w[7] << 16)), x.w, s);
        return h2f(*(const u16*)b) * ((const float2*)(xr + k))[i / 2].x * (float)s;
    }
};

// 16 f32 weights against 16 f32 inputs (rows 16-byte aligned: k a multiple of 16).
template <>
struct Item<T_F32> {
    static __device__ __forceinline__ float dot(const u8* row, int i, const u8* xr, int) {
        const float4* w = (const float4*)row + 4 * i;
        const float4* x = (const float4*)xr + 4 * i;
        float s = 0.0f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const float4 a = w[l], c = x[l];
            s += a.x * c.x + a.y * c.y + a.z * c.z + a.w * c.w;
        }
        return s;
    }
};

// Bytes between the products' input rows: quantized rows (quantize_x) or f32 rows.
template <int TY>
__device__ __forceinline__ i64 x_bytes(int k) {
    return reads_q8<TY>() ? (i64)xq_stride(k) : 4 * (i64)k;
}

// This block's group computes row r = blockIdx.x * (4 / g) + group of each of the M matrices
// `row(r, m)` times up to MMV_MAX input rows `xrow(col)` and hands sums[m][col] to
// `done(r, sums)` (called by the group's first thread). Every thread of the block must call it.
// FIXED: the rows do not depend on earlier kernels, so they are prefetched into L2 before the
// wait for those kernels (grid_sync); otherwise the caller has waited already.
template <int TY, int M, bool FIXED, typename Row, typename XRow, typename Done>
__device__ __forceinline__ void mmv_group(int nrows, int k, int ncols, int g, Row row, XRow xrow,
                                          Done done) {
    __shared__ float red[MMV_WARPS][M][MMV_MAX];
    const int gsize = WARP * g;
    const int r = blockIdx.x * (MMV_WARPS / g) + threadIdx.x / gsize;
    const int t = threadIdx.x % gsize;
    if constexpr (FIXED) {
        // the rows' weights into L2 while the kernel before this one finishes
        if (r < nrows) {
            const int bytes = k / Fmt<TY>::elems * Fmt<TY>::bytes;
#pragma unroll
            for (int m = 0; m < M; m++)
                for (int o = 32 * t; o < bytes; o += 32 * gsize) prefetch_l2(row(r, m) + o);
        }
        grid_sync();
    }
    float acc[M][MMV_MAX];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int col = 0; col < MMV_MAX; col++) acc[m][col] = 0.0f;
    if (r < nrows) {
        const int items = k / 16;
        for (int i = t; i < items; i += gsize) {
#pragma unroll
            for (int m = 0; m < M; m++) {
                const u8* w = row(r, m);
#pragma unroll
                for (int col = 0; col < MMV_MAX; col++)
                    if (col < ncols) acc[m][col] += Item<TY>::dot(w, i, xrow(col), k);
            }
        }
    }
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int col = 0; col < MMV_MAX; col++)
            if (col < ncols) {
                const float v = warp_sum(acc[m][col]);
                if (lane == 0) red[warp][m][col] = v;
            }
    __syncthreads();
    if (r < nrows && t == 0) {
        float sums[M][MMV_MAX];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int col = 0; col < MMV_MAX; col++) {
                float s = 0.0f;
                if (col < ncols)
                    for (int w = 0; w < g; w++) s += red[warp + w][m][col];
                sums[m][col] = s;
            }
        done(r, sums);
    }
}

// Rows [0, nrows) of the M matrices `row(r, m)` times `ncols` input rows starting at `x` (f32
// rows k apart, or quantized rows: x_bytes), each row's sums handed to `done(r, sums)`: a group
// of `arg` warps per row for the grouped types, else `arg` rows per warp through staged spans.
// FIXED as for mmv_group.
template <int TY, int M, bool FIXED, typename Row, typename Done>
__device__ __forceinline__ void mmv_rows(int nrows, int k, int ncols, const float* x, int arg,
                                         Row row, Done done) {
    if constexpr (grouped<TY>()) {
        mmv_group<TY, M, FIXED>(
            nrows, k, ncols, arg, row,
            [&](int col) { return (const u8*)x + col * x_bytes<TY>(k); }, done);
    } else {
        __shared__ __align__(16) u32 buf[MMV_WARPS][2][Span<TY>::words];
        if constexpr (FIXED) grid_sync();
        const int r0 = warp_row0(arg);
        mmv_warp<TY, M>(
            r0, min(r0 + arg, nrows), k, ncols, k, row, [&](int) { return x; }, done,
            buf[threadIdx.x / WARP]);
    }
}

template <int TY>
__device__ __forceinline__ void mmv_impl(const u8* W, i64 row_bytes, int k, int nrows,
                                         const float* x, int ncols, float* y, int rpw) {
    mmv_rows<TY, 1, true>(
        nrows, k, ncols, x, rpw, [&](int r, int) { return W + r * row_bytes; },
        [&](int r, float (*s)[MMV_MAX]) {
            for (int col = 0; col < ncols; col++) y[(i64)col * nrows + r] = s[0][col];
        });
}

// Row r of expert ids[p] times x row (p / x_div): x_div is the experts used per token when all
// of a token's experts read the same input (gate, up), 1 when each has its own (down). A negative
// id is an expert computed elsewhere (on the host): its output row is left as it is.
template <int TY>
__device__ __forceinline__ void mmv_id_impl(const u8* W, i64 row_bytes, i64 expert_bytes, int k,
                                            int nrows, const int* ids, const float* x, int x_div,
                                            float* y, int rpw) {
    grid_sync();
    const int p = blockIdx.y;
    const int id = ids[p];
    if (id < 0) return;
    const u8* we = W + (i64)id * expert_bytes;
    mmv_rows<TY, 1, false>(
        nrows, k, 1, x_row<TY>(x, p / x_div, k), rpw,
        [&](int r, int) { return we + r * row_bytes; },
        [&](int r, float (*s)[MMV_MAX]) { y[(i64)p * nrows + r] = s[0][0]; });
}

// The gate and up rows r of expert ids[p] times x row (p / x_div) in one pass, written as
// act(gate) * up: the same sums as two mmv_id products and a glu, in a third of the launches.
template <int TY>
__device__ __forceinline__ void mmv_id_glu_impl(const u8* G, const u8* U, i64 row_bytes,
                                                i64 expert_bytes, int k, int nrows,
                                                const int* ids, const float* x, int x_div,
                                                int gelu, float* y, int rpw) {
    grid_sync();
    const int p = blockIdx.y;
    const int id = ids[p];
    if (id < 0) return;
    const i64 e0 = (i64)id * expert_bytes;
    mmv_rows<TY, 2, false>(
        nrows, k, 1, x_row<TY>(x, p / x_div, k), rpw,
        [&](int r, int m) { return (m == 0 ? G : U) + e0 + r * row_bytes; },
        [&](int r, float (*s)[MMV_MAX]) {
            y[(i64)p * nrows + r] = glu_of(s[0][0], s[1][0], gelu);
        });
}

// Each thread dequantizes one 32-element chunk; chunks enumerate the output in order, so a
// warp's 32 chunks are 2 KiB of contiguous f16, staged in shared memory and written with 16-byte
// stores (writing each thread's 32 halves directly scatters every store over 32 segments).
// Blocks are 128 threads.
template <int TY>
__device__ __forceinline__ void deq_f16_impl(const u8* W, i64 row_bytes, int k, int nrows,
                                             u16* out) {
    __shared__ __align__(16) u16 stage[4][32 * 32];
    grid_sync();
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
    grid_sync();
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

// Up to three matrices of one type and row length times the same input in one launch (a
// layer's q, k and v): rows [0, rows0) are W0's, the next rows1 W1's, the last rows2 W2's, each
// written to its own output. g as for mmv_group.
#define GROUPED_KERNELS(NAME, TY)                                                                \
    extern "C" __global__ void mmv3_##NAME(const u8* W0, const u8* W1, const u8* W2,            \
                                           i64 row_bytes, int k, int rows0, int rows1,          \
                                           int rows2, const float* x, int ncols, float* y0,     \
                                           float* y1, float* y2, int g) {                       \
        mmv_rows<TY, 1, true>(                                                                   \
            rows0 + rows1 + rows2, k, ncols, x, g,                                               \
            [&](int r, int) {                                                                    \
                return r < rows0           ? W0 + r * row_bytes                                  \
                       : r < rows0 + rows1 ? W1 + (r - rows0) * row_bytes                        \
                                           : W2 + (r - rows0 - rows1) * row_bytes;               \
            },                                                                                   \
            [&](int r, float (*s)[MMV_MAX]) {                                                    \
                float* y = y0;                                                                   \
                int n = rows0;                                                                   \
                if (r >= rows0 + rows1) {                                                        \
                    y = y2, n = rows2, r -= rows0 + rows1;                                       \
                } else if (r >= rows0) {                                                         \
                    y = y1, n = rows1, r -= rows0;                                               \
                }                                                                                \
                for (int col = 0; col < ncols; col++) y[(i64)col * n + r] = s[0][col];           \
            });                                                                                  \
    }

GROUPED_KERNELS(f32, T_F32)
GROUPED_KERNELS(q4_k, T_Q4_K)
GROUPED_KERNELS(q8_0, T_Q8_0)
