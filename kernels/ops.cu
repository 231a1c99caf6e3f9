// Element-wise and row-wise operations of the forward pass, all on f32 activations.

// One block per row: out = x * rsqrt(mean(x^2) + eps) * w (in place when out == x), after
// x += add when `add` is given (the residual sum written back to x, then normalized: one launch
// for the two). A row of up to NORM_REGS values per thread is held in registers with its
// weights, all loaded at once, so the row's loads and the weights' overlap instead of each
// waiting for the one before (decode normalizes single rows, where those waits were the
// kernel's time); wider rows loop. Either way each thread sums the same values in the same
// order. With `xq`, held rows of a multiple of 32 values (blocks of 256 threads) are also
// written quantized as quantize_x would quantize `out` (the same bits): each warp holds 32
// consecutive values per register, one quantization chunk.
#define NORM_REGS 16
extern "C" __global__ void rms_norm(float* x, const float* add, const float* w, float* out,
                                    int width, float eps, u8* xq) {
    grid_sync();
    float* xr = x + (i64)blockIdx.x * width;
    const float* ar = add ? add + (i64)blockIdx.x * width : nullptr;
    float* orow = out + (i64)blockIdx.x * width;
    const bool held = width <= NORM_REGS * (int)blockDim.x;
    float v[NORM_REGS], g[NORM_REGS];
    float s = 0.0f;
    if (held) {
#pragma unroll
        for (int j = 0; j < NORM_REGS; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            v[j] = i < width ? xr[i] : 0.0f;
            g[j] = i < width ? w[i] : 0.0f;
            if (ar && i < width) v[j] += ar[i];
        }
        if (ar) {
#pragma unroll
            for (int j = 0; j < NORM_REGS; j++) {
                const int i = threadIdx.x + j * blockDim.x;
                if (i < width) xr[i] = v[j];
            }
        }
#pragma unroll
        for (int j = 0; j < NORM_REGS; j++) s += v[j] * v[j];
    } else {
        for (int i = threadIdx.x; i < width; i += blockDim.x) {
            const float a = ar ? xr[i] + ar[i] : xr[i];
            if (ar) xr[i] = a;
            s += a * a;
        }
    }
    __shared__ float part[32];
    s = warp_sum(s);
    if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = s;
    __syncthreads();
    if (threadIdx.x < WARP) {
        float t = threadIdx.x < blockDim.x / WARP ? part[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0) part[0] = t;
    }
    __syncthreads();
    const float scale = rsqrtf(part[0] / width + eps);
    if (held) {
#pragma unroll
        for (int j = 0; j < NORM_REGS; j++) {
            const int i = threadIdx.x + j * blockDim.x;
            if (i < width) orow[i] = v[j] * scale * g[j];
        }
        if (xq) {
            u8* qrow = xq + (i64)blockIdx.x * xq_stride(width);
            const int lane = threadIdx.x % WARP;
#pragma unroll
            for (int j = 0; j < NORM_REGS; j++) {
                const int i = threadIdx.x + j * blockDim.x;
                // the warp's chunk is wholly in the row or wholly past it
                if (i - lane < width) {
                    const float o = v[j] * scale * g[j];
                    const float amax = warp_max(fabsf(o));
                    const float d = amax / 127.0f;
                    const int q = amax == 0.0f ? 0 : (int)rintf(o / d);
                    qrow[i] = (u8)(signed char)q;
                    const float sum = warp_sum((float)q);
                    if (lane == 0) ((float2*)(qrow + width))[i / 32] = make_float2(d, d * sum);
                }
            }
        }
    } else {
        // each thread reads back only the values it wrote
        for (int i = threadIdx.x; i < width; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
    }
}

// The end of attention's projections for (head, token) = (blockIdx.x, blockIdx.y), in one
// launch: heads [0, hq) are queries (in q), [hq, hq + hkv) keys (in k), [hq + hkv, hq + 2 hkv)
// values (in v, hv wide). Query and key heads get their RMS norm when qn / kn is given (weights
// hd wide), RoPE on their first n_rot values as `rope` computes it, and queries are then scaled
// by q_scale in place; keys and values go into cache cell cells[t] as f16 (rows of hkv heads).
// The same results as rms_norm, rope, scale and kv_store in turn. Block of 128 threads.
extern "C" __global__ void attn_prologue(float* q, const float* k, const float* v,
                                         const float* qn, const float* kn, const int* pos,
                                         const int* cells, u16* k_cache, u16* v_cache, int hq,
                                         int hkv, int hd, int hv, int n_rot, float base,
                                         float freq_scale, int neox, float eps, float q_scale) {
    grid_sync();
    __shared__ float row[256];
    __shared__ float part[4];
    const int h = blockIdx.x, t = blockIdx.y;
    const int cell = cells[t];
    if (h >= hq + hkv) {
        const int vh = h - hq - hkv;
        const float* src = v + ((i64)t * hkv + vh) * hv;
        u16* dst = v_cache + (i64)cell * hkv * hv + (i64)vh * hv;
        for (int i = threadIdx.x; i < hv; i += blockDim.x) dst[i] = f2h(src[i]);
        return;
    }
    const bool is_q = h < hq;
    const float* src = is_q ? q + ((i64)t * hq + h) * hd : k + ((i64)t * hkv + (h - hq)) * hd;
    const float* nw = is_q ? qn : kn;
    float s = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const float a = src[i];
        row[i] = a;
        s += a * a;
    }
    if (nw) {
        s = warp_sum(s);
        if (threadIdx.x % WARP == 0) part[threadIdx.x / WARP] = s;
    }
    __syncthreads();
    if (nw) {
        float tot = 0.0f;
        for (int w = 0; w < (int)blockDim.x / WARP; w++) tot += part[w];
        const float scale = rsqrtf(tot / hd + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = row[i] * scale * nw[i];
        __syncthreads();
    }
    const float theta_scale = powf(base, -2.0f / n_rot);
    const float sq = is_q ? q_scale : 1.0f;
    float* qdst = q + ((i64)t * hq + h) * hd;
    u16* kdst = k_cache + (i64)cell * hkv * hd + (i64)(h - hq) * hd;
    for (int i = threadIdx.x; i < hd / 2; i += blockDim.x) {
        int a, b;
        float y0, y1;
        if (i < n_rot / 2) {
            const float theta = freq_scale * (float)pos[t] * powf(theta_scale, (float)i);
            float sn, cs;
            sincosf(theta, &sn, &cs);
            a = neox ? i : 2 * i;
            b = neox ? i + n_rot / 2 : 2 * i + 1;
            const float x0 = row[a], x1 = row[b];
            y0 = x0 * cs - x1 * sn;
            y1 = x0 * sn + x1 * cs;
        } else {
            // past the rotated dims: the values as they are, two at a time
            a = 2 * i;
            b = 2 * i + 1;
            y0 = row[a];
            y1 = row[b];
        }
        if (is_q) {
            qdst[a] = y0 * sq;
            qdst[b] = y1 * sq;
        } else {
            kdst[a] = f2h(y0);
            kdst[b] = f2h(y1);
        }
    }
}

// RoPE on `heads` heads of width hd per token, the first n_rot dims of each: adjacent pairs
// (neox = 0) or i with i + n_rot/2 (neox = 1). Block per (head, token), thread per pair.
extern "C" __global__ void rope(float* x, const int* pos, int heads, int hd, int n_rot,
                                float base, float freq_scale, int neox) {
    grid_sync();
    const int h = blockIdx.x, t = blockIdx.y;
    float* v = x + ((i64)t * heads + h) * hd;
    const float theta_scale = powf(base, -2.0f / n_rot);
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        const float theta = freq_scale * (float)pos[t] * powf(theta_scale, (float)i);
        float s, c;
        sincosf(theta, &s, &c);
        const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}

extern "C" __global__ void add(float* x, const float* y, i64 n) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void add_bias(float* x, const float* b, int width, i64 n) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) x[i] += b[i % width];
}

extern "C" __global__ void scale(float* x, float s, i64 n) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void softcap(float* x, float cap, i64 n) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

// g = act(g) * u (see glu_of).
extern "C" __global__ void glu(float* g, const float* u, i64 n, int gelu) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) g[i] = glu_of(g[i], u[i], gelu);
}

extern "C" __global__ void to_f16(const float* x, u16* out, i64 n) {
    grid_sync();
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(x[i]);
}

// Writes token t's row into cache cell cells[t] as f16.
extern "C" __global__ void kv_store(const float* src, u16* cache, const int* cells, int width) {
    grid_sync();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) cache[(i64)cells[t] * width + i] = f2h(src[(i64)t * width + i]);
}

// out[j] = x[idx[j]] (rows of `width`).
extern "C" __global__ void gather_rows(const float* x, const int* idx, float* out, int width) {
    grid_sync();
    const int j = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) out[(i64)j * width + i] = x[(i64)idx[j] * width + i];
}

// out[idx[j]] = x[j]; rows with idx[j] < 0 (padding) are skipped.
// Rows are blockIdx.x (a padded expert group can exceed grid.y's 65535).
extern "C" __global__ void scatter_rows(const float* x, const int* idx, float* out, int width) {
    grid_sync();
    const int j = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < width && idx[j] >= 0) out[(i64)idx[j] * width + i] = x[(i64)j * width + i];
}

// out[j] = f16(x[idx[j]]), zeros where idx[j] < 0 (padding rows of a per-expert group).
extern "C" __global__ void gather_f16(const float* x, const int* idx, u16* out, int width) {
    grid_sync();
    const int j = blockIdx.x;
    const int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= width) return;
    out[(i64)j * width + i] = idx[j] < 0 ? (u16)0 : f2h(x[(i64)idx[j] * width + i]);
}

#define MAX_EXPERTS 512

// Expert routing, one warp per token: softmax over the router logits, the k best (ties to the
// lower index), optionally renormalized (the sum clamped as ggml does) and scaled.
extern "C" __global__ void route(const float* logits, int ne, int k, int norm, float wscale,
                                 int* ids, float* w) {
    grid_sync();
    const int t = blockIdx.x;
    const int lane = threadIdx.x;
    const float* l = logits + (i64)t * ne;
    float p[MAX_EXPERTS / WARP];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / WARP; i++) {
        const int e = lane + WARP * i;
        p[i] = e < ne ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < MAX_EXPERTS / WARP; i++) {
        const int e = lane + WARP * i;
        p[i] = e < ne ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
    sum = warp_sum(sum);
    float chosen_sum = 0.0f;
    for (int s = 0; s < k; s++) {
        float best = -1.0f;
        int best_e = MAX_EXPERTS;
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / WARP; i++) {
            const int e = lane + WARP * i;
            if (e < ne && (p[i] > best || (p[i] == best && e < best_e))) {
                best = p[i];
                best_e = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffff, best, o);
            const int oe = __shfl_xor_sync(0xffffffff, best_e, o);
            if (ob > best || (ob == best && oe < best_e)) {
                best = ob;
                best_e = oe;
            }
        }
        // compared in the unrolled loop: indexing p with best_e would move it to local memory
#pragma unroll
        for (int i = 0; i < MAX_EXPERTS / WARP; i++)
            if (lane + WARP * i == best_e) p[i] = -1.0f;
        const float prob = best / sum;
        chosen_sum += prob;
        if (lane == 0) {
            ids[t * k + s] = best_e;
            w[t * k + s] = prob;
        }
    }
    if (lane == 0) {
        const float div = norm ? fmaxf(chosen_sum, 6.103515625e-5f) : 1.0f;
        for (int s = 0; s < k; s++) w[t * k + s] = w[t * k + s] / div * wscale;
    }
}

// out[t] = sum over slots s of w[t k + s] * y[t k + s] (rows of `width`), or that sum added
// to out[t] when `accumulate` (the residual stream's add, in the same launch).
extern "C" __global__ void moe_combine(const float* y, const float* w, float* out, int k,
                                       int width, int accumulate) {
    grid_sync();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += w[t * k + j] * y[((i64)t * k + j) * width + i];
    float* o = out + (i64)t * width + i;
    *o = accumulate ? *o + s : s;
}
