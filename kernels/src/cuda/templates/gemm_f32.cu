// ---- autokernel: f32 GEMM, C[M x N] = A[M x K] . B[K x N], all row-major ----
// Compile-time constants (from the config): BM BN BK (block tile), WM WN (warp tile), TM TN
// (thread tile), STAGES (shared-memory pipeline depth), VEC (floats per global load: 1, 2, 4),
// SPLIT_K (K is cut into SPLIT_K slices along gridDim.z, summed with atomicAdd into a zeroed C).
//
// Block: (BM/WM) x (BN/WN) warps. A warp's 32 lanes form a 4 x 8 grid; each lane owns
// MI x NI thread tiles of TM x TN outputs, MI = WM / (4 TM), NI = WN / (8 TN), so the warp
// covers WM x WN. Shared memory holds STAGES copies of the A tile (BM x BK, row-major, pitch
// BK + 4) and the B tile (BK x BN, pitch BN + 4); on sm_80+ they are filled with cp.async while
// earlier stages are being multiplied. Every global access is predicated: any M, N, K >= 1.
//
// Launch: grid (ceil(N / BN), ceil(M / BM), SPLIT_K), block THREADS, dynamic shared memory
// STAGES * (BM * (BK + 4) + BK * (BN + 4)) * 4 bytes.

#define THREADS ((BM / WM) * (BN / WN) * 32)
#define WARPS_N (BN / WN)
#define MI (WM / (4 * TM))
#define NI (WN / (8 * TN))
#define APITCH (BK + 4)
#define BPITCH (BN + 4)
#define A_STAGE (BM * APITCH)
#define B_STAGE (BK * BPITCH)

static_assert(BM % WM == 0 && BN % WN == 0, "the warp tile divides the block tile");
static_assert(WM % (4 * TM) == 0 && WN % (8 * TN) == 0, "thread tiles cover the warp tile");
static_assert(BK % 4 == 0 && TN % 4 == 0, "float4 shared-memory reads");
static_assert(BK % VEC == 0 && BN % VEC == 0, "vector loads stay inside a tile row");
static_assert(THREADS <= 1024, "at most 1024 threads per block");
static_assert(STAGES >= 1, "at least one stage");

// Copies the ROWS x COLS tile at (row0, col0) of a row-major matrix with leading dimension ld
// into shared memory (row pitch PITCH). Rows >= row_end or columns >= col_end read as zero.
// `vec_ok` says VEC-wide chunks are aligned and never straddle col_end (col_end % VEC == 0).
template <int ROWS, int COLS, int PITCH>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const float* __restrict__ src,
                                          int ld, int row0, int col0, int row_end, int col_end,
                                          bool vec_ok, int tid) {
    if (VEC > 1 && vec_ok) {
        constexpr int CHUNKS = COLS / VEC;
#pragma unroll 4
        for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS;
            const int cc = (c % CHUNKS) * VEC;
            const int gr = row0 + r, gc = col0 + cc;
            const bool in = gr < row_end && gc < col_end;
            const float* g = in ? src + (size_t)gr * ld + gc : src;
            ak_cp_async<VEC * 4>(dst + r * PITCH + cc, g, in);
        }
    } else {
#pragma unroll 4
        for (int c = tid; c < ROWS * COLS; c += THREADS) {
            const int r = c / COLS;
            const int cc = c % COLS;
            const int gr = row0 + r, gc = col0 + cc;
            const bool in = gr < row_end && gc < col_end;
            const float* g = in ? src + (size_t)gr * ld + gc : src;
            ak_cp_async<4>(dst + r * PITCH + cc, g, in);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_f32(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
         int M, int N, int K, int k_per_split, int a_vec, int b_vec, int c_vec) {
    extern __shared__ __align__(16) float smem[];
    float* As = smem;
    float* Bs = smem + STAGES * A_STAGE;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;
    const int lane_r = lane >> 3;  // 0..3
    const int lane_c = lane & 7;   // 0..7
    const int block_m = blockIdx.y * BM;
    const int block_n = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_per_split;
    const int k_end = min(K, k_begin + k_per_split);
    const int ntiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    if (ntiles == 0) return;  // an empty trailing K slice (uniform across the block)

    float acc[MI][TM][NI][TN];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[mi][i][ni][j] = 0.0f;

    // This thread's first row in the A tile and first column in the B tile.
    const int a_row = warp_m * WM + lane_r * TM;
    const int b_col = warp_n * WN + lane_c * TN;

    auto load_stage = [&](int stage, int t) {
        const int k0 = k_begin + t * BK;
        load_tile<BM, BK, APITCH>(As + stage * A_STAGE, A, K, block_m, k0, M, k_end, a_vec, tid);
        load_tile<BK, BN, BPITCH>(Bs + stage * B_STAGE, B, N, k0, block_n, k_end, N, b_vec, tid);
    };

    auto compute_stage = [&](int stage) {
        const float* as = As + stage * A_STAGE + a_row * APITCH;
        const float* bs = Bs + stage * B_STAGE + b_col;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 4) {
            float a[MI][TM][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    const float4 v =
                        *reinterpret_cast<const float4*>(as + (mi * 4 * TM + i) * APITCH + kk);
                    a[mi][i][0] = v.x;
                    a[mi][i][1] = v.y;
                    a[mi][i][2] = v.z;
                    a[mi][i][3] = v.w;
                }
#pragma unroll
            for (int k4 = 0; k4 < 4; ++k4) {
                float b[NI][TN];
#pragma unroll
                for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                    for (int j = 0; j < TN; j += 4) {
                        const float4 v = *reinterpret_cast<const float4*>(
                            bs + (kk + k4) * BPITCH + ni * 8 * TN + j);
                        b[ni][j] = v.x;
                        b[ni][j + 1] = v.y;
                        b[ni][j + 2] = v.z;
                        b[ni][j + 3] = v.w;
                    }
#pragma unroll
                for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                    for (int i = 0; i < TM; ++i)
#pragma unroll
                        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                            for (int j = 0; j < TN; ++j)
                                acc[mi][i][ni][j] = fmaf(a[mi][i][k4], b[ni][j], acc[mi][i][ni][j]);
            }
        }
    };

    if constexpr (STAGES == 1) {
        for (int t = 0; t < ntiles; ++t) {
            load_stage(0, t);
            ak_cp_async_commit();
            ak_cp_async_wait<0>();
            __syncthreads();
            compute_stage(0);
            __syncthreads();
        }
    } else {
        // Prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty groups keep the
        // count uniform when there are fewer tiles than stages).
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < ntiles) load_stage(s, s);
            ak_cp_async_commit();
        }
        for (int t = 0; t < ntiles; ++t) {
            // Groups committed so far cover tiles 0 .. t+STAGES-2: waiting until at most
            // STAGES-2 are pending means tile t has landed (for this thread; the barrier makes
            // it so for all, and also retires every reader of the stage refilled below).
            ak_cp_async_wait<(STAGES >= 2 ? STAGES - 2 : 0)>();
            __syncthreads();
            const int next = t + STAGES - 1;
            if (next < ntiles) load_stage(next % STAGES, next);
            ak_cp_async_commit();
            compute_stage(t % STAGES);
        }
        ak_cp_async_wait<0>();
    }

    // Epilogue: each lane writes its MI x NI tiles of TM x TN, predicated on M and N.
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int row = block_m + a_row + mi * 4 * TM + i;
            if (row >= M) continue;
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
#pragma unroll
                for (int j = 0; j < TN; j += 4) {
                    const int col = block_n + b_col + ni * 8 * TN + j;
                    float* dst = C + (size_t)row * N + col;
                    const float v0 = acc[mi][i][ni][j], v1 = acc[mi][i][ni][j + 1];
                    const float v2 = acc[mi][i][ni][j + 2], v3 = acc[mi][i][ni][j + 3];
                    if (SPLIT_K == 1) {
                        if (c_vec && col + 3 < N) {
                            *reinterpret_cast<float4*>(dst) = make_float4(v0, v1, v2, v3);
                        } else {
                            if (col < N) dst[0] = v0;
                            if (col + 1 < N) dst[1] = v1;
                            if (col + 2 < N) dst[2] = v2;
                            if (col + 3 < N) dst[3] = v3;
                        }
                    } else {
                        if (col < N) atomicAdd(dst, v0);
                        if (col + 1 < N) atomicAdd(dst + 1, v1);
                        if (col + 2 < N) atomicAdd(dst + 2, v2);
                        if (col + 3 < N) atomicAdd(dst + 3, v3);
                    }
                }
        }
}
