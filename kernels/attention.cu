// Attention over the f16 KV cache, for prompts and decode alike. One block of ATT_WARPS warps per
// (head, query token): each warp walks every ATT_WARPS-th visible key with an online softmax,
// then the warps' partial sums are merged through shared memory. Head widths up to 256.

#define ATT_WARPS 4
#define ATT_MAXD 256

// q: [tokens][n_head * hk]; kc/vc: one layer's cache, [cells][n_head_kv * hk|hv]; the keys of
// token t are the cells base[t] + j for positions j in [lo, pos[t]] (lo from the sliding window).
extern "C" __global__ void attn_f16(const float* q, const u16* kc, const u16* vc, const int* base,
                                    const int* pos, float* out, int n_head, int n_head_kv, int hk,
                                    int hv, float scale, int n_swa) {
    grid_sync();
    const int h = blockIdx.x, t = blockIdx.y;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int hkv = h / (n_head / n_head_kv);
    const int p = pos[t];
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const int kstride = n_head_kv * hk, vstride = n_head_kv * hv;
    const float* qh = q + ((i64)t * n_head + h) * hk;
    float qr[ATT_MAXD / WARP];
#pragma unroll
    for (int i = 0; i < ATT_MAXD / WARP; i++) {
        const int d = lane + WARP * i;
        qr[i] = d < hk ? qh[d] : 0.0f;
    }
    float m = -INFINITY, s = 0.0f;
    float acc[ATT_MAXD / WARP];
#pragma unroll
    for (int i = 0; i < ATT_MAXD / WARP; i++) acc[i] = 0.0f;
    for (int j = lo + warp; j <= p; j += ATT_WARPS) {
        const i64 cell = (i64)base[t] + j;
        const u16* kr = kc + cell * kstride + (i64)hkv * hk;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAXD / WARP; i++) {
            const int d = lane + WARP * i;
            if (d < hk) dot += qr[i] * h2f(kr[d]);
        }
        dot = warp_sum(dot) * scale;
        const float mn = fmaxf(m, dot);
        const float a = expf(m - mn), e = expf(dot - mn);
        s = s * a + e;
        const u16* vr = vc + cell * vstride + (i64)hkv * hv;
#pragma unroll
        for (int i = 0; i < ATT_MAXD / WARP; i++) {
            const int d = lane + WARP * i;
            if (d < hv) acc[i] = acc[i] * a + e * h2f(vr[d]);
        }
        m = mn;
    }
    __shared__ float sm[ATT_WARPS], ss[ATT_WARPS];
    __shared__ float sacc[ATT_WARPS][ATT_MAXD];
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAXD / WARP; i++) {
        const int d = lane + WARP * i;
        if (d < hv) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm[w]);
    float total = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) total += sm[w] == -INFINITY ? 0.0f : ss[w] * expf(sm[w] - mx);
    float* o = out + ((i64)t * n_head + h) * hv;
    for (int d = threadIdx.x; d < hv; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w] != -INFINITY) v += sacc[w][d] * expf(sm[w] - mx);
        o[d] = v / total;
    }
}

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* tmp) {
    v = is_max ? warp_max(v) : warp_sum(v);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    __syncthreads();
    if (lane == 0) tmp[warp] = v;
    __syncthreads();
    v = lane < nw ? tmp[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(v) : warp_sum(v);
}

// Prompt attention through cuBLAS, the step between the two products: row (h, i) of S holds
// query i's scores over the keys 0..kv_len-1 of its sequence, query i sitting at position p0 + i.
// Keys after the query or outside the sliding window get weight 0. P is written as f16.
extern "C" __global__ void softmax_rows(const float* S, u16* P, int kv_len, int p0, int m,
                                        float scale, int n_swa) {
    grid_sync();
    __shared__ float tmp[32];
    const i64 row = blockIdx.x;
    const int p = p0 + (int)(row % m);
    const int lo = n_swa > 0 ? max(0, p - n_swa + 1) : 0;
    const float* s = S + row * kv_len;
    u16* o = P + row * kv_len;
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j <= p; j += blockDim.x) mx = fmaxf(mx, s[j] * scale);
    mx = block_reduce(mx, true, tmp);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j <= p; j += blockDim.x) sum += expf(s[j] * scale - mx);
    sum = block_reduce(sum, false, tmp);
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < kv_len; j += blockDim.x)
        o[j] = (j < lo || j > p) ? (u16)0 : f2h(expf(s[j] * scale - mx) * inv);
}
