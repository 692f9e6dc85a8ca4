// ---- autokernel: fused attention, O = softmax(Q K^T / sqrt(D) [+ causal mask]) V ----
// Flash-style: one block owns BR query rows of one (batch, head) and streams the keys in tiles
// of BC, keeping a running max m, running sum l and unnormalised output per row (online
// softmax), so the Sq x Sk score matrix never exists. Q, K, V, O are [batch*heads][seq][D],
// row-major, of type elem_t (f32, or bf16 bits when DTYPE_BF16); arithmetic is f32.
//
// Compile-time constants: BR (query rows per block), BC (keys per tile), WARPS (warps per
// block; each owns BR / WARPS rows), HEAD_DIM (D), DTYPE_BF16 (0 or 1).
// Causal masking is bottom-right aligned (as in FlashAttention 2): query i sees key j iff
// j <= i + (Sk - Sq). Key tiles past the block's last visible key are never loaded, and a row
// skips tiles it cannot see; a row that sees no key at all outputs zeros.
//
// Launch: grid (ceil(Sq / BR), batch * heads), block WARPS * 32, dynamic shared memory
// (BR * D + BC * (D + 1) + BC * D + WARPS * BC) * 4 bytes.

#define THREADS (WARPS * 32)
#define RPW (BR / WARPS)
#define DC ((HEAD_DIM + 31) / 32)
#define KPL (BC / 32)
#define KPITCH (HEAD_DIM + 1)

static_assert(BR % WARPS == 0, "whole rows per warp");
static_assert(BC % 32 == 0, "keys are spread over the 32 lanes");
static_assert(THREADS <= 1024, "at most 1024 threads per block");

#if DTYPE_BF16
typedef ak_bf16 elem_t;
__device__ __forceinline__ float load_elem(const elem_t* p) { return ak_bf16_to_f32(*p); }
__device__ __forceinline__ void store_elem(elem_t* p, float v) { *p = ak_f32_to_bf16(v); }
#else
typedef float elem_t;
__device__ __forceinline__ float load_elem(const elem_t* p) { return *p; }
__device__ __forceinline__ void store_elem(elem_t* p, float v) { *p = v; }
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
attention(const elem_t* __restrict__ Q, const elem_t* __restrict__ K, const elem_t* __restrict__ V,
          elem_t* __restrict__ O, int seq_q, int seq_k, float scale_log2, int causal) {
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;                      // [BR][HEAD_DIM], pre-scaled by scale * log2(e)
    float* ks = qs + BR * HEAD_DIM;        // [BC][KPITCH]: the pad spreads a column over banks
    float* vs = ks + BC * KPITCH;          // [BC][HEAD_DIM]
    float* ps = vs + BC * HEAD_DIM + (threadIdx.x >> 5) * BC;  // [WARPS][BC]: this warp's weights

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const size_t bh = blockIdx.y;
    const int q0 = blockIdx.x * BR;
    const elem_t* q = Q + bh * (size_t)seq_q * HEAD_DIM;
    const elem_t* k = K + bh * (size_t)seq_k * HEAD_DIM;
    const elem_t* v = V + bh * (size_t)seq_k * HEAD_DIM;
    elem_t* o = O + bh * (size_t)seq_q * HEAD_DIM;
    const int offset = seq_k - seq_q;  // causal: query i sees keys j <= i + offset

    for (int i = tid; i < BR * HEAD_DIM; i += THREADS) {
        const int r = i / HEAD_DIM, d = i % HEAD_DIM;
        qs[i] = (q0 + r < seq_q) ? load_elem(q + (size_t)(q0 + r) * HEAD_DIM + d) * scale_log2 : 0.0f;
    }

    float m_run[RPW], l_run[RPW], acc[RPW][DC];
#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
        m_run[rr] = AK_NEG_INF;
        l_run[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[rr][c] = 0.0f;
    }

    // Keys at or past kv_end are invisible to every row of this block.
    int kv_end = seq_k;
    if (causal) kv_end = max(0, min(seq_k, q0 + BR + offset));

    for (int kv0 = 0; kv0 < kv_end; kv0 += BC) {
        __syncthreads();  // Q is loaded; every reader of the previous K/V tile is done
        for (int i = tid; i < BC * HEAD_DIM; i += THREADS) {
            const int j = i / HEAD_DIM, d = i % HEAD_DIM;
            const bool in = kv0 + j < seq_k;
            const size_t g = (size_t)(kv0 + j) * HEAD_DIM + d;
            ks[j * KPITCH + d] = in ? load_elem(k + g) : 0.0f;
            vs[j * HEAD_DIM + d] = in ? load_elem(v + g) : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
            const int r = warp * RPW + rr;  // the same for the whole warp: branches are uniform
            const int qi = q0 + r;
            if (qi >= seq_q) continue;
            const int limit = causal ? min(seq_k, qi + offset + 1) : seq_k;  // visible: j < limit
            if (kv0 >= limit) continue;  // the whole tile is masked for this row

            // Scores (log2 domain) for keys kv0 + lane + 32 c.
            float s[KPL];
            float tile_max = AK_NEG_INF;
            const float* qr = qs + r * HEAD_DIM;
#pragma unroll
            for (int c = 0; c < KPL; ++c) {
                const int j = c * 32 + lane;
                if (kv0 + c * 32 >= limit) {  // these 32 keys are all masked (warp-uniform)
                    s[c] = AK_NEG_INF;
                    continue;
                }
                const float* kr = ks + j * KPITCH;
                float dot = 0.0f;
#pragma unroll 8
                for (int d = 0; d < HEAD_DIM; ++d) dot = fmaf(qr[d], kr[d], dot);
                s[c] = (kv0 + j < limit) ? dot : AK_NEG_INF;
                tile_max = fmaxf(tile_max, s[c]);
            }
            // Key kv0 is visible (kv0 < limit), so the tile max and m_new are finite.
            tile_max = ak_warp_max(tile_max);
            const float m_new = fmaxf(m_run[rr], tile_max);
            const float alpha = exp2f(m_run[rr] - m_new);  // 0 on the first visible tile
            float psum = 0.0f;
#pragma unroll
            for (int c = 0; c < KPL; ++c) {
                s[c] = exp2f(s[c] - m_new);  // masked keys: exp2(-inf) = 0
                psum += s[c];
            }
            psum = ak_warp_sum(psum);
            l_run[rr] = l_run[rr] * alpha + psum;
            m_run[rr] = m_new;
#pragma unroll
            for (int c = 0; c < DC; ++c) acc[rr][c] *= alpha;

            // acc[:, d] += sum_j p_j V[j, d] over the visible keys of the tile, p_j broadcast
            // from this warp's slice of shared memory; lane owns d = lane + 32 dc.
#pragma unroll
            for (int c = 0; c < KPL; ++c) ps[c * 32 + lane] = s[c];
            __syncwarp();
            const int jmax = min(BC, limit - kv0);
#pragma unroll 4
            for (int j = 0; j < jmax; ++j) {
                const float p = ps[j];
                const float* vr = vs + j * HEAD_DIM;
#pragma unroll
                for (int dc = 0; dc < DC; ++dc) {
                    const int d = dc * 32 + lane;
                    if (d < HEAD_DIM) acc[rr][dc] = fmaf(p, vr[d], acc[rr][dc]);
                }
            }
            __syncwarp();  // every lane has read ps before the next row overwrites it
        }
    }

#pragma unroll
    for (int rr = 0; rr < RPW; ++rr) {
        const int qi = q0 + warp * RPW + rr;
        if (qi >= seq_q) continue;
        const float inv = l_run[rr] > 0.0f ? 1.0f / l_run[rr] : 0.0f;
#pragma unroll
        for (int dc = 0; dc < DC; ++dc) {
            const int d = dc * 32 + lane;
            if (d < HEAD_DIM) store_elem(o + (size_t)qi * HEAD_DIM + d, acc[rr][dc] * inv);
        }
    }
}
