// Runs upstream ggml's own reference routines, for bloomery's model tests to compare against.
// Built by the test from the llama.cpp sdist: cc -I ggml/include -I ggml/src ggml_oracle.c
// ggml/src/ggml-quants.c -lm. The few ggml.c symbols ggml-quants.c refers to are stubbed below:
// the routines used here never reach them.
//
//   ggml_oracle dequant TYPE IN OUT   IN: raw blocks of TYPE; OUT: little-endian f32
//   ggml_oracle quantize TYPE IN OUT  IN: f32 activations; OUT: blocks of TYPE (q8_0, q8_1, q8_K)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-quants.h"

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt);
    abort();
}
size_t ggml_type_size(enum ggml_type type) { (void) type; abort(); }
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void) type; (void) ne; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void) type; abort(); }

typedef void (*dequant_fn)(const void *, float *, int64_t);
typedef void (*quant_fn)(const float *, void *, int64_t);

static const struct {
    const char * name;
    dequant_fn fn;
    int block;
    int bytes;
} DEQUANT[] = {
    {"q1_0", (dequant_fn) dequantize_row_q1_0, 128, 18},
    {"q2_0", (dequant_fn) dequantize_row_q2_0, 64, 18},
    {"q4_0", (dequant_fn) dequantize_row_q4_0, 32, 18},
    {"q4_1", (dequant_fn) dequantize_row_q4_1, 32, 20},
    {"q5_0", (dequant_fn) dequantize_row_q5_0, 32, 22},
    {"q5_1", (dequant_fn) dequantize_row_q5_1, 32, 24},
    {"q8_0", (dequant_fn) dequantize_row_q8_0, 32, 34},
    {"mxfp4", (dequant_fn) dequantize_row_mxfp4, 32, 17},
    {"nvfp4", (dequant_fn) dequantize_row_nvfp4, 64, 36},
    {"q2_K", (dequant_fn) dequantize_row_q2_K, 256, 84},
    {"q3_K", (dequant_fn) dequantize_row_q3_K, 256, 110},
    {"q4_K", (dequant_fn) dequantize_row_q4_K, 256, 144},
    {"q5_K", (dequant_fn) dequantize_row_q5_K, 256, 176},
    {"q6_K", (dequant_fn) dequantize_row_q6_K, 256, 210},
    {"q8_K", (dequant_fn) dequantize_row_q8_K, 256, 292},
    {"tq1_0", (dequant_fn) dequantize_row_tq1_0, 256, 54},
    {"tq2_0", (dequant_fn) dequantize_row_tq2_0, 256, 66},
    {"iq2_xxs", (dequant_fn) dequantize_row_iq2_xxs, 256, 66},
    {"iq2_xs", (dequant_fn) dequantize_row_iq2_xs, 256, 74},
    {"iq2_s", (dequant_fn) dequantize_row_iq2_s, 256, 82},
    {"iq3_xxs", (dequant_fn) dequantize_row_iq3_xxs, 256, 98},
    {"iq3_s", (dequant_fn) dequantize_row_iq3_s, 256, 110},
    {"iq1_s", (dequant_fn) dequantize_row_iq1_s, 256, 50},
    {"iq1_m", (dequant_fn) dequantize_row_iq1_m, 256, 56},
    {"iq4_nl", (dequant_fn) dequantize_row_iq4_nl, 32, 18},
    {"iq4_xs", (dequant_fn) dequantize_row_iq4_xs, 256, 136},
};

static const struct {
    const char * name;
    quant_fn fn;
    int block;
    int bytes;
} QUANT[] = {
    {"q8_0", (quant_fn) quantize_row_q8_0_ref, 32, 34},
    {"q8_1", (quant_fn) quantize_row_q8_1_ref, 32, 36},
    {"q8_K", (quant_fn) quantize_row_q8_K_ref, 256, 292},
};

static void * slurp(const char * path, long * len) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void * buf = malloc(*len + 1);
    if (fread(buf, 1, *len, f) != (size_t) *len) { perror(path); exit(1); }
    fclose(f);
    return buf;
}

static void spill(const char * path, const void * buf, long len) {
    FILE * f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != (size_t) len) { perror(path); exit(1); }
    fclose(f);
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: ggml_oracle dequant|quantize TYPE IN OUT\n");
        return 2;
    }
    long len;
    void * in = slurp(argv[3], &len);
    if (!strcmp(argv[1], "dequant")) {
        for (size_t i = 0; i < sizeof(DEQUANT) / sizeof(DEQUANT[0]); i++) {
            if (strcmp(DEQUANT[i].name, argv[2])) continue;
            int64_t n = len / DEQUANT[i].bytes * DEQUANT[i].block;
            float * out = malloc(n * sizeof(float) + 1);
            DEQUANT[i].fn(in, out, n);
            spill(argv[4], out, n * sizeof(float));
            return 0;
        }
    } else if (!strcmp(argv[1], "quantize")) {
        for (size_t i = 0; i < sizeof(QUANT) / sizeof(QUANT[0]); i++) {
            if (strcmp(QUANT[i].name, argv[2])) continue;
            int64_t n = len / sizeof(float);
            long out_len = n / QUANT[i].block * QUANT[i].bytes;
            void * out = malloc(out_len + 1);
            QUANT[i].fn(in, out, n);
            spill(argv[4], out, out_len);
            return 0;
        }
    }
    fprintf(stderr, "ggml_oracle: no %s routine for %s\n", argv[1], argv[2]);
    return 2;
}
