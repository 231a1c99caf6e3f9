// Dequantization of ggml block formats, 32 elements at a time. `deq<TY>(row, c, v)` writes
// elements [32c, 32c + 32) of a row that starts at `row` into v. TY is ggml's type id; the
// block layouts are ggml's (ggml-common.h), checked against the CPU reference by gpu-check.

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_IQ4_NL 20
#define T_IQ4_XS 23
#define T_BF16 30
#define T_MXFP4 39
#define T_NVFP4 40

__constant__ signed char KV_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};
__constant__ signed char KV_FP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// K-quants' 6-bit scale and min of sub-block j from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// E8M0 exponent to 2^(x-127)/2 (E2M1 levels are stored doubled).
__device__ __forceinline__ float e8m0_half(u8 x) {
    return __uint_as_float(x < 2 ? (0x00200000u << x) : ((u32)(x - 1) << 23));
}

// Unsigned E4M3 (top bit ignored, 0x7f read as 0), halved like e8m0_half.
__device__ __forceinline__ float ue4m3_half(u8 x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    int e = (x >> 3) & 0xF;
    float man = (float)(x & 7);
    float raw = e == 0 ? man * 0.001953125f : (1.0f + man * 0.125f) * exp2f((float)(e - 7));
    return raw * 0.5f;
}

template <int TY> struct Fmt;
#define FMT(TY, ELEMS, BYTES) \
    template <> struct Fmt<TY> { static const int elems = ELEMS; static const int bytes = BYTES; };
FMT(T_F32, 32, 128)
FMT(T_F16, 32, 64)
FMT(T_BF16, 32, 64)
FMT(T_Q4_0, 32, 18)
FMT(T_Q4_1, 32, 20)
FMT(T_Q5_0, 32, 22)
FMT(T_Q5_1, 32, 24)
FMT(T_Q8_0, 32, 34)
FMT(T_Q2_K, 256, 84)
FMT(T_Q3_K, 256, 110)
FMT(T_Q4_K, 256, 144)
FMT(T_Q5_K, 256, 176)
FMT(T_Q6_K, 256, 210)
FMT(T_IQ4_NL, 32, 18)
FMT(T_IQ4_XS, 256, 136)
FMT(T_MXFP4, 32, 17)
FMT(T_NVFP4, 64, 36)

template <int TY>
__device__ __forceinline__ void deq(const u8* row, int c, float* v) {
    const int per = Fmt<TY>::elems / 32;  // chunks per block
    const u8* b = row + (i64)(c / per) * Fmt<TY>::bytes;
    const int j = c % per;  // chunk within the block
    if constexpr (TY == T_F32) {
        const float* f = (const float*)(row) + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = f[l];
    } else if constexpr (TY == T_F16) {
        const u16* h = (const u16*)(row) + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = h2f(h[l]);
    } else if constexpr (TY == T_BF16) {
        const u16* h = (const u16*)(row) + 32 * c;
        for (int l = 0; l < 32; l++) v[l] = bf2f(h[l]);
    } else if constexpr (TY == T_Q4_0) {
        float d = h2f(ld16(b));
        for (int l = 0; l < 16; l++) {
            v[l] = ((b[2 + l] & 0xF) - 8) * d;
            v[l + 16] = ((b[2 + l] >> 4) - 8) * d;
        }
    } else if constexpr (TY == T_Q4_1) {
        float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        for (int l = 0; l < 16; l++) {
            v[l] = (b[4 + l] & 0xF) * d + m;
            v[l + 16] = (b[4 + l] >> 4) * d + m;
        }
    } else if constexpr (TY == T_Q5_0) {
        float d = h2f(ld16(b));
        u32 qh = ld32(b + 2);
        for (int l = 0; l < 16; l++) {
            int x0 = (b[6 + l] & 0xF) | (((qh >> l) << 4) & 0x10);
            int x1 = (b[6 + l] >> 4) | ((qh >> (l + 12)) & 0x10);
            v[l] = (x0 - 16) * d;
            v[l + 16] = (x1 - 16) * d;
        }
    } else if constexpr (TY == T_Q5_1) {
        float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        u32 qh = ld32(b + 4);
        for (int l = 0; l < 16; l++) {
            int x0 = (b[8 + l] & 0xF) | (((qh >> l) << 4) & 0x10);
            int x1 = (b[8 + l] >> 4) | ((qh >> (l + 12)) & 0x10);
            v[l] = x0 * d + m;
            v[l + 16] = x1 * d + m;
        }
    } else if constexpr (TY == T_Q8_0) {
        float d = h2f(ld16(b));
        for (int l = 0; l < 32; l++) v[l] = (float)(i8)b[2 + l] * d;
    } else if constexpr (TY == T_Q2_K) {
        // scales[16], qs[64], d, dmin
        float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
        int n = j / 4, s = j % 4;
        for (int l = 0; l < 32; l++) {
            u8 sc = b[8 * n + 2 * s + l / 16];
            int q = (b[16 + 32 * n + l] >> (2 * s)) & 3;
            v[l] = d * (sc & 0xF) * q - dmin * (sc >> 4);
        }
    } else if constexpr (TY == T_Q3_K) {
        // hmask[32], qs[64], scales[12], d
        float d = h2f(ld16(b + 108));
        const u8* s12 = b + 96;
        int n = j / 4, s = j % 4;
        for (int half = 0; half < 2; half++) {
            int is = 8 * n + 2 * s + half;  // which of the 16 6-bit scales
            int lo = is < 8 ? (s12[is % 8] >> (4 * (is / 8))) & 0xF : (s12[is % 8] >> 4) & 0xF;
            int hi = (s12[8 + is % 4] >> (2 * (is / 4))) & 3;
            int sc = (lo | (hi << 4)) - 32;
            for (int l = 16 * half; l < 16 * half + 16; l++) {
                int q = (b[32 + 32 * n + l] >> (2 * s)) & 3;
                int h = (b[l] >> j) & 1;
                v[l] = d * sc * (q - (h ? 0 : 4));
            }
        }
    } else if constexpr (TY == T_Q4_K) {
        float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const u8* q = b + 16 + 32 * (j / 2);
        int sh = 4 * (j % 2);
        float ds = d * sc, dm = dmin * m;
        for (int l = 0; l < 32; l++) v[l] = ds * ((q[l] >> sh) & 0xF) - dm;
    } else if constexpr (TY == T_Q5_K) {
        float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        const u8* qh = b + 16;
        const u8* q = b + 48 + 32 * (j / 2);
        int sh = 4 * (j % 2);
        float ds = d * sc, dm = dmin * m;
        for (int l = 0; l < 32; l++) {
            int x = ((q[l] >> sh) & 0xF) | (((qh[l] >> j) & 1) << 4);
            v[l] = ds * x - dm;
        }
    } else if constexpr (TY == T_Q6_K) {
        // ql[128], qh[64], scales[16] (i8), d
        float d = h2f(ld16(b + 208));
        int n = j / 4, qd = j % 4;
        const u8* ql = b + 64 * n + 32 * (qd & 1);
        const u8* qh = b + 128 + 32 * n;
        const i8* sc = (const i8*)(b + 192) + 8 * n + 2 * qd;
        int shl = 4 * (qd >> 1), shh = 2 * qd;
        for (int l = 0; l < 32; l++) {
            int q = (((ql[l] >> shl) & 0xF) | (((qh[l] >> shh) & 3) << 4)) - 32;
            v[l] = d * sc[l / 16] * q;
        }
    } else if constexpr (TY == T_IQ4_NL) {
        float d = h2f(ld16(b));
        for (int l = 0; l < 16; l++) {
            v[l] = d * KV_IQ4NL[b[2 + l] & 0xF];
            v[l + 16] = d * KV_IQ4NL[b[2 + l] >> 4];
        }
    } else if constexpr (TY == T_IQ4_XS) {
        // d, scales_h (u16), scales_l[4], qs[128]
        float d = h2f(ld16(b));
        int sh = ld16(b + 2);
        int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4);
        float dl = d * (ls - 32);
        const u8* q = b + 8 + 16 * j;
        for (int l = 0; l < 16; l++) {
            v[l] = dl * KV_IQ4NL[q[l] & 0xF];
            v[l + 16] = dl * KV_IQ4NL[q[l] >> 4];
        }
    } else if constexpr (TY == T_MXFP4) {
        float d = e8m0_half(b[0]);
        for (int l = 0; l < 16; l++) {
            v[l] = d * KV_FP4[b[1 + l] & 0xF];
            v[l + 16] = d * KV_FP4[b[1 + l] >> 4];
        }
    } else if constexpr (TY == T_NVFP4) {
        for (int g = 0; g < 2; g++) {
            int s = 2 * j + g;
            float d = ue4m3_half(b[s]);
            const u8* q = b + 4 + 8 * s;
            for (int l = 0; l < 8; l++) {
                v[16 * g + l] = d * KV_FP4[q[l] & 0xF];
                v[16 * g + l + 8] = d * KV_FP4[q[l] >> 4];
            }
        }
    }
}

// Every type above, for the kernels that are instantiated once per type.
#define FOR_EACH_TYPE(X)                                                                       \
    X(f32, T_F32) X(f16, T_F16) X(bf16, T_BF16) X(q4_0, T_Q4_0) X(q4_1, T_Q4_1) X(q5_0, T_Q5_0) \
    X(q5_1, T_Q5_1) X(q8_0, T_Q8_0) X(q2_k, T_Q2_K) X(q3_k, T_Q3_K) X(q4_k, T_Q4_K)            \
    X(q5_k, T_Q5_K) X(q6_k, T_Q6_K) X(iq4_nl, T_IQ4_NL) X(iq4_xs, T_IQ4_XS) X(mxfp4, T_MXFP4)  \
    X(nvfp4, T_NVFP4)
