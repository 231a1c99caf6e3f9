//! CPU kernels: threaded matrix-vector and matrix-matrix products on quantized weights, with a
//! scalar reference path. Knows nothing about models or HTTP.
