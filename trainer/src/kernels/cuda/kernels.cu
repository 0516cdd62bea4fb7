// Trainyard's CUDA kernels, f32 in and out, statistics in f32.
//
// Each forward/backward pair computes exactly what the fused CPU op of the same name computes
// (kernels/gelu.rs, loss.rs, softmax.rs, norm.rs; the math is stated there and repeated in one
// line above each kernel here), so one set of wiring and tests serves both devices. Why fused:
// from candle's primitives each of these is 6 to 25 kernels, every one reading and writing the
// whole tensor; here each direction is one pass (two for the LayerNorm backward's column sums).
//
// The optimizer kernels update one parameter tensor per launch in place: AdamW is one
// read-modify-write of p, m and v instead of about ten whole-tensor ops, and the gradients'
// global norm is per-block partial sums reduced in a fixed order (deterministic, no atomics).
//
// Built by trainer/build.rs with nvcc into PTX when the `cuda` feature is on; loaded once per
// device by kernels/cuda/mod.rs.

#include <stdint.h>
#include <cuda_bf16.h>

typedef unsigned long long u64;

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block, returned to every thread. blockDim.x is a multiple of 32, at most 1024.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __syncthreads();  // a previous call's readers are done with `part`
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

// Max over the block, returned to every thread.
__device__ float block_max(float v) {
    __shared__ float part[32];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? part[lane] : -INFINITY;
        v = warp_max(v);
        if (lane == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)blockDim.x * gridDim.x)

// ---- GELU (tanh form): y = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3) ----

#define GELU_K 0.7978845608028654f
#define GELU_C 0.044715f

extern "C" __global__ void ty_gelu_fwd_f32(const float* x, float* y, u64 n) {
    GRID_STRIDE(i, n) {
        const float v = x[i];
        const float u = GELU_K * (v + GELU_C * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

// dx = g (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx), du/dx = sqrt(2/pi) (1 + 3 0.044715 x^2)
extern "C" __global__ void ty_gelu_bwd_f32(const float* x, const float* g, float* dx, u64 n) {
    GRID_STRIDE(i, n) {
        const float v = x[i];
        const float t = tanhf(GELU_K * (v + GELU_C * v * v * v));
        const float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        dx[i] = g[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}

// ---- cross-entropy, one block per row of the (N, V) logits ----

// loss_n = logsumexp(x_n) - x_n[t_n]; NaN for a target outside the vocabulary (the CPU op
// refuses it; a kernel cannot, and NaN stops training at the loss check).
extern "C" __global__ void ty_ce_fwd_f32(const float* x, const uint32_t* targets, float* loss, u64 v) {
    const float* row = x + (u64)blockIdx.x * v;
    float m = -INFINITY;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s);
    if (threadIdx.x == 0) {
        const uint32_t t = targets[blockIdx.x];
        loss[blockIdx.x] = t < v ? logf(s) - (row[t] - m) : NAN;
    }
}

// dx_n = g_n (softmax(x_n) - onehot(t_n))
extern "C" __global__ void ty_ce_bwd_f32(const float* x, const uint32_t* targets, const float* g,
                                         float* dx, u64 v) {
    const u64 r = blockIdx.x;
    const float* row = x + r * v;
    float* out = dx + r * v;
    float m = -INFINITY;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) s += expf(row[j] - m);
    s = block_sum(s);
    const float gr = g[r], scale = gr / s;
    const uint32_t t = targets[r];
    for (u64 j = threadIdx.x; j < v; j += blockDim.x)
        out[j] = expf(row[j] - m) * scale - (j == t ? gr : 0.0f);
}

// ---- causal softmax over (.., T, T) scores, one block per row ----
// In f32, or in bf16 storage with f32 arithmetic: under bf16 autocast the attention's scores and
// probabilities stay bf16 between its two matrix products (the biggest tensors of the model).

__device__ __forceinline__ float load(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, u64 i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, u64 i, float v) { p[i] = __float2bfloat16(v); }

// y = softmax(scale x + causal mask): row r is query position i = r mod T, which sees keys
// 0..=i; the rest of the row is 0.
template <typename T>
__device__ void causal_softmax_fwd(const T* x, T* y, u64 t, float scale) {
    const u64 r = blockIdx.x, keep = r % t + 1, off = r * t;
    float m = -INFINITY;
    for (u64 j = threadIdx.x; j < keep; j += blockDim.x) m = fmaxf(m, load(x, off + j) * scale);
    m = block_max(m);
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < keep; j += blockDim.x) s += expf(load(x, off + j) * scale - m);
    s = block_sum(s);
    const float inv = 1.0f / s;
    for (u64 j = threadIdx.x; j < t; j += blockDim.x)
        store(y, off + j, j < keep ? expf(load(x, off + j) * scale - m) * inv : 0.0f);
}

// dx = scale y (g - sum(g y)) per row of `cols`, from the softmax output y and its gradient g.
template <typename T>
__device__ void softmax_bwd(const T* y, const T* g, T* dx, u64 cols, float scale) {
    const u64 off = (u64)blockIdx.x * cols;
    float dot = 0.0f;
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x) dot += load(y, off + j) * load(g, off + j);
    dot = block_sum(dot);
    for (u64 j = threadIdx.x; j < cols; j += blockDim.x)
        store(dx, off + j, scale * load(y, off + j) * (load(g, off + j) - dot));
}

extern "C" __global__ void ty_causal_softmax_fwd_f32(const float* x, float* y, u64 t, float scale) {
    causal_softmax_fwd(x, y, t, scale);
}
extern "C" __global__ void ty_causal_softmax_fwd_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, u64 t,
                                                      float scale) {
    causal_softmax_fwd(x, y, t, scale);
}
extern "C" __global__ void ty_softmax_bwd_f32(const float* y, const float* g, float* dx, u64 cols,
                                              float scale) {
    softmax_bwd(y, g, dx, cols, scale);
}
extern "C" __global__ void ty_softmax_bwd_bf16(const __nv_bfloat16* y, const __nv_bfloat16* g,
                                               __nv_bfloat16* dx, u64 cols, float scale) {
    softmax_bwd(y, g, dx, cols, scale);
}

// ---- LayerNorm over the last dim C of (N, C), with weight and bias ----

// Mean and 1/sqrt(var + eps) of one row, two passes (as the CPU op), every thread gets both.
__device__ void row_stats(const float* xr, u64 c, float eps, float* mean, float* rstd) {
    float s = 0.0f;
    for (u64 j = threadIdx.x; j < c; j += blockDim.x) s += xr[j];
    const float mu = block_sum(s) / (float)c;
    float q = 0.0f;
    for (u64 j = threadIdx.x; j < c; j += blockDim.x) {
        const float d = xr[j] - mu;
        q += d * d;
    }
    const float var = block_sum(q) / (float)c;
    *mean = mu;
    *rstd = 1.0f / sqrtf(var + eps);
}

// y = (x - mean) rstd w + b, one block per row.
extern "C" __global__ void ty_layer_norm_fwd_f32(const float* x, const float* w, const float* b,
                                                 float* y, u64 c, float eps) {
    const u64 off = (u64)blockIdx.x * c;
    float mean, rstd;
    row_stats(x + off, c, eps, &mean, &rstd);
    for (u64 j = threadIdx.x; j < c; j += blockDim.x)
        y[off + j] = (x[off + j] - mean) * rstd * w[j] + b[j];
}

// Columns one thread of the backward owns (C <= LN_MAX_COLS_PER_THREAD * blockDim.x).
#define LN_MAX_COLS_PER_THREAD 16

// Each block takes `rows_per_block` rows: xh = (x - mean) rstd, gh = g w,
// dx = rstd (gh - mean(gh) - xh mean(gh xh)); and its partial column sums of g xh (dw) and g
// (db) into partial[block][0..C] and partial[block][C..2C].
extern "C" __global__ void ty_layer_norm_bwd_f32(const float* x, const float* w, const float* g,
                                                 float* dx, float* partial, u64 rows, u64 c,
                                                 u64 rows_per_block, float eps) {
    float dw[LN_MAX_COLS_PER_THREAD], db[LN_MAX_COLS_PER_THREAD];
    for (int k = 0; k < LN_MAX_COLS_PER_THREAD; ++k) dw[k] = db[k] = 0.0f;
    const u64 r0 = (u64)blockIdx.x * rows_per_block;
    const u64 r1 = min(rows, r0 + rows_per_block);
    for (u64 r = r0; r < r1; ++r) {
        const float* xr = x + r * c;
        const float* gr = g + r * c;
        float mean, rstd;
        row_stats(xr, c, eps, &mean, &rstd);
        float sgh = 0.0f, sghx = 0.0f;
        for (u64 j = threadIdx.x; j < c; j += blockDim.x) {
            const float xh = (xr[j] - mean) * rstd, gh = gr[j] * w[j];
            sgh += gh;
            sghx += gh * xh;
        }
        const float mgh = block_sum(sgh) / (float)c, mghx = block_sum(sghx) / (float)c;
        int k = 0;
        for (u64 j = threadIdx.x; j < c; j += blockDim.x, ++k) {
            const float xh = (xr[j] - mean) * rstd;
            dx[r * c + j] = rstd * (gr[j] * w[j] - mgh - xh * mghx);
            dw[k] += gr[j] * xh;
            db[k] += gr[j];
        }
    }
    float* p = partial + (u64)blockIdx.x * 2 * c;
    int k = 0;
    for (u64 j = threadIdx.x; j < c; j += blockDim.x, ++k) {
        p[j] = dw[k];
        p[c + j] = db[k];
    }
}

// The same backward with one warp per row, for C <= 32 * LN_WARP_MAX_COLS: a lane keeps its
// columns' x in registers and the row's sums are warp shuffles, so a row costs no block-wide
// barrier (the block version above takes four per row and was the slowest LayerNorm pass in a
// GPT-2-sized step). Warp w of a block takes rows r0 + w, r0 + w + LN_WARPS, ...; the warps'
// column sums are added in warp order in shared memory, then written as the block's partials.
#define LN_WARPS 8
#define LN_WARP_MAX_COLS 32
extern "C" __global__ void ty_layer_norm_bwd_warp_f32(const float* x, const float* w, const float* g,
                                                      float* dx, float* partial, u64 rows, u64 c,
                                                      u64 rows_per_block, float eps) {
    __shared__ float sums[2 * 32 * LN_WARP_MAX_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float dw[LN_WARP_MAX_COLS], db[LN_WARP_MAX_COLS], xv[LN_WARP_MAX_COLS];
#pragma unroll
    for (int k = 0; k < LN_WARP_MAX_COLS; ++k) dw[k] = db[k] = 0.0f;
    const u64 r0 = (u64)blockIdx.x * rows_per_block;
    const u64 r1 = min(rows, r0 + rows_per_block);
    for (u64 r = r0 + warp; r < r1; r += LN_WARPS) {
        const float* xr = x + r * c;
        const float* gr = g + r * c;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_WARP_MAX_COLS; ++k) {
            const u64 j = lane + 32 * k;
            xv[k] = j < c ? xr[j] : 0.0f;
            s += xv[k];
        }
        const float mean = warp_sum(s) / (float)c;
        float q = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_WARP_MAX_COLS; ++k) {
            const float d = lane + 32 * k < c ? xv[k] - mean : 0.0f;
            q += d * d;
        }
        const float rstd = 1.0f / sqrtf(warp_sum(q) / (float)c + eps);
        float sgh = 0.0f, sghx = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_WARP_MAX_COLS; ++k) {
            const u64 j = lane + 32 * k;
            if (j < c) {
                const float xh = (xv[k] - mean) * rstd, gh = gr[j] * w[j];
                sgh += gh;
                sghx += gh * xh;
            }
        }
        const float mgh = warp_sum(sgh) / (float)c, mghx = warp_sum(sghx) / (float)c;
#pragma unroll
        for (int k = 0; k < LN_WARP_MAX_COLS; ++k) {
            const u64 j = lane + 32 * k;
            if (j < c) {
                const float xh = (xv[k] - mean) * rstd, gj = gr[j];
                dx[r * c + j] = rstd * (gj * w[j] - mgh - xh * mghx);
                dw[k] += gj * xh;
                db[k] += gj;
            }
        }
    }
    for (int v = 0; v < LN_WARPS; ++v) {
        if (warp == v) {
#pragma unroll
            for (int k = 0; k < LN_WARP_MAX_COLS; ++k) {
                const u64 j = lane + 32 * k;
                if (j < c) {
                    sums[j] = v == 0 ? dw[k] : sums[j] + dw[k];
                    sums[c + j] = v == 0 ? db[k] : sums[c + j] + db[k];
                }
            }
        }
        __syncthreads();
    }
    float* p = partial + (u64)blockIdx.x * 2 * c;
    for (u64 j = threadIdx.x; j < 2 * c; j += blockDim.x) p[j] = sums[j];
}

// out[j] = sum over blocks of partial[block][j], j < 2C, blocks in order (deterministic).
extern "C" __global__ void ty_column_sums_f32(const float* partial, float* out, u64 blocks, u64 width) {
    GRID_STRIDE(j, width) {
        float s = 0.0f;
        for (u64 b = 0; b < blocks; ++b) s += partial[b * width + j];
        out[j] = s;
    }
}

// ---- optimizer ----

// One AdamW update of one tensor in place: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p = p shrink - lr_bc1 m / (sqrt(v) inv_sqrt_bc2 + eps), where shrink = 1 - lr wd for decayed
// tensors, lr_bc1 = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t).
extern "C" __global__ void ty_adamw_f32(float* p, const float* g, float* m, float* v, u64 n,
                                        float beta1, float beta2, float eps, float lr_bc1,
                                        float inv_sqrt_bc2, float shrink) {
    GRID_STRIDE(i, n) {
        const float gi = g[i];
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * shrink - lr_bc1 * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    }
}

// partial[blockIdx.x] = this block's share of sum(g^2) over one tensor (gridDim.x blocks).
extern "C" __global__ void ty_sum_squares_f32(const float* g, float* partial, u64 n) {
    float s = 0.0f;
    GRID_STRIDE(i, n) s += g[i] * g[i];
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sqrt(sum of the partials) (the global norm); out[1] = the factor clipping scales the
// gradients by: max_norm / (norm + 1e-6) when the norm is finite and above max_norm (> 0), else 1.
// One block; partials summed in a fixed order per thread, then across the block.
extern "C" __global__ void ty_norm_and_clip_f32(const float* partial, u64 n, float max_norm, float* out) {
    float s = 0.0f;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        const float norm = sqrtf(s);
        out[0] = norm;
        out[1] = (max_norm > 0.0f && isfinite(norm) && norm > max_norm) ? max_norm / (norm + 1e-6f) : 1.0f;
    }
}

// ---- rows: embedding lookups and MoE token routing along dim 0 ----
// candle's index_add on CUDA gives each of the D columns one thread that walks all M indices in
// order; here every element has its own thread, and sums go through atomic adds (so their order,
// and the last bits of a sum over repeated ids, vary from run to run).

// out[m, :] = table[ids[m], :]; ids at or beyond `rows` give 0.
extern "C" __global__ void ty_gather_rows_f32(const float* table, const uint32_t* ids, float* out,
                                              u64 m, u64 d, u64 rows) {
    GRID_STRIDE(i, m * d) {
        const u64 r = ids[i / d];
        out[i] = r < rows ? table[r * d + i % d] : 0.0f;
    }
}

// out[ids[m], :] += src[m, :] over a zero-filled (rows, D) out; ids at or beyond `rows` are skipped.
extern "C" __global__ void ty_scatter_add_rows_f32(const float* src, const uint32_t* ids, float* out,
                                                   u64 m, u64 d, u64 rows) {
    GRID_STRIDE(i, m * d) {
        const u64 r = ids[i / d];
        if (r < rows) atomicAdd(out + r * d + i % d, src[i]);
    }
}

// ---- Helpers of the bf16 linear layer (kernels/cuda/linear.rs) ----

// y = bf16(x), rounded to nearest even (as candle's cast).
extern "C" __global__ void ty_cast_f32_bf16(const float* x, __nv_bfloat16* y, u64 n) {
    GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

// y (rows, cols) = the bias b (cols,) on every row: the GEMM then accumulates onto it.
extern "C" __global__ void ty_fill_rows_f32(const float* b, float* y, u64 rows, u64 cols) {
    GRID_STRIDE(i, rows * cols) y[i] = b[i % cols];
}

// y = v everywhere.
extern "C" __global__ void ty_fill_f32(float* y, float v, u64 n) {
    GRID_STRIDE(i, n) y[i] = v;
}

// ---- Helper of the bf16 attention (kernels/cuda/attention.rs) ----

// src (B, T, S, H, hd) f32 → dst (S, B, H, T, hd) bf16: the packed q/k/v (S = 3) or an output
// gradient (S = 1) split into per-head row blocks for the batched products, cast on the way.
extern "C" __global__ void ty_split_heads_bf16(const float* src, __nv_bfloat16* dst, u64 B, u64 T,
                                               u64 S, u64 H, u64 hd) {
    GRID_STRIDE(i, S * B * H * T * hd) {
        u64 r = i / hd;
        const u64 e = i - r * hd;
        const u64 t = r % T;
        r /= T;
        const u64 h = r % H;
        r /= H;
        const u64 b = r % B;
        const u64 s = r / B;
        dst[i] = __float2bfloat16_rn(src[(((b * T + t) * S + s) * H + h) * hd + e]);
    }
}
