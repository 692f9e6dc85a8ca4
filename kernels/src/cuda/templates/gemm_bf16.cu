// ---- autokernel: bf16 tensor-core GEMM, C[M x N] (f32) = A[M x K] . B[K x N] (bf16), row-major ----
// f32 accumulation on tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, sm_80+.
// Compile-time constants (from the config): BM BN BK (block tile), WM WN (warp tile, made of
// (WM/16) x (WN/8) mma tiles), STAGES (cp.async pipeline depth), VEC (bf16 per global load:
// 2, 4, 8), SPLIT_K (K slices along gridDim.z, summed with atomicAdd into a zeroed C).
//
// Shared memory: STAGES copies of the A tile (BM x BK, pitch BK + 8) and B tile (BK x BN,
// pitch BN + 8): the 16-byte pad puts the 8 rows one ldmatrix reads in different banks.
// A fragments come from ldmatrix.x4, B fragments (column-major for mma) from ldmatrix.x2.trans
// of the row-major B tile. Every global access is predicated: any M, N, K >= 1.
//
// Launch: grid (ceil(N / BN), ceil(M / BM), SPLIT_K), block THREADS, dynamic shared memory
// STAGES * (BM * (BK + 8) + BK * (BN + 8)) * 2 bytes.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "gemm_bf16 needs sm_80 or newer (bf16 mma.sync)"
#endif

#define THREADS ((BM / WM) * (BN / WN) * 32)
#define WARPS_N (BN / WN)
#define MI (WM / 16)
#define NI (WN / 8)
#define APITCH (BK + 8)
#define BPITCH (BN + 8)
#define A_STAGE (BM * APITCH)
#define B_STAGE (BK * BPITCH)

static_assert(BM % WM == 0 && BN % WN == 0, "the warp tile divides the block tile");
static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tiles are made of 16 x 8 mma tiles");
static_assert(BK % 16 == 0, "mma consumes K in steps of 16");
static_assert(BK % VEC == 0 && BN % VEC == 0, "vector loads stay inside a tile row");
static_assert(VEC == 2 || VEC == 4 || VEC == 8, "cp.async moves 4, 8 or 16 bytes");
static_assert(THREADS <= 1024, "at most 1024 threads per block");
static_assert(STAGES >= 1, "at least one stage");

// Copies the ROWS x COLS bf16 tile at (row0, col0) of a row-major matrix (leading dimension
// ld) into shared memory (pitch PITCH); rows >= row_end or columns >= col_end read as zero.
// With `vec_ok` (col_end % VEC == 0, aligned rows) it moves VEC elements per cp.async; else
// it falls back to 2-byte loads and stores, which cp.async cannot do.
template <int ROWS, int COLS, int PITCH>
__device__ __forceinline__ void load_tile(ak_bf16* __restrict__ dst, const ak_bf16* __restrict__ src,
                                          int ld, int row0, int col0, int row_end, int col_end,
                                          bool vec_ok, int tid) {
    if (vec_ok) {
        constexpr int CHUNKS = COLS / VEC;
#pragma unroll 4
        for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS;
            const int cc = (c % CHUNKS) * VEC;
            const int gr = row0 + r, gc = col0 + cc;
            const bool in = gr < row_end && gc < col_end;
            const ak_bf16* g = in ? src + (size_t)gr * ld + gc : src;
            ak_cp_async<VEC * 2>(dst + r * PITCH + cc, g, in);
        }
    } else {
#pragma unroll 4
        for (int c = tid; c < ROWS * COLS; c += THREADS) {
            const int r = c / COLS;
            const int cc = c % COLS;
            const int gr = row0 + r, gc = col0 + cc;
            dst[r * PITCH + cc] = (gr < row_end && gc < col_end) ? src[(size_t)gr * ld + gc] : (ak_bf16)0;
        }
    }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int (&r)[4], const ak_bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(ak_smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(unsigned int (&r)[2], const ak_bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(ak_smem_addr(p)));
}

// d += a . b on one 16 x 8 x 16 tile.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned int (&a)[4],
                                          const unsigned int (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_bf16(const ak_bf16* __restrict__ A, const ak_bf16* __restrict__ B, float* __restrict__ C,
          int M, int N, int K, int k_per_split, int a_vec, int b_vec, int c_vec) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    ak_bf16* As = reinterpret_cast<ak_bf16*>(smem_raw);
    ak_bf16* Bs = As + STAGES * A_STAGE;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;
    const int block_m = blockIdx.y * BM;
    const int block_n = blockIdx.x * BN;
    const int k_begin = blockIdx.z * k_per_split;
    const int k_end = min(K, k_begin + k_per_split);
    const int ntiles = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    if (ntiles == 0) return;  // an empty trailing K slice (uniform across the block)

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    auto load_stage = [&](int stage, int t) {
        const int k0 = k_begin + t * BK;
        load_tile<BM, BK, APITCH>(As + stage * A_STAGE, A, K, block_m, k0, M, k_end, a_vec, tid);
        load_tile<BK, BN, BPITCH>(Bs + stage * B_STAGE, B, N, k0, block_n, k_end, N, b_vec, tid);
    };

    auto compute_stage = [&](int stage) {
        const ak_bf16* as = As + stage * A_STAGE;
        const ak_bf16* bs = Bs + stage * B_STAGE;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned int a[MI][4];
            unsigned int b[NI][2];
            // A (16 x 16, row-major): lanes 0-15 address rows 0-15 at column kk, lanes 16-31
            // rows 0-15 at column kk + 8; registers 0..3 = rows 0-7 / 8-15 x cols 0-7 / 8-15.
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                ldmatrix_x4(a[mi], as + (warp_m * WM + mi * 16 + (lane & 15)) * APITCH + kk + (lane >> 4) * 8);
            // B (16 x 8): lanes 0-15 address rows kk .. kk+15 of the row-major tile; .trans
            // hands each lane the column-major pairs mma expects.
#pragma unroll
            for (int ni = 0; ni < NI; ++ni)
                ldmatrix_x2_trans(b[ni], bs + (kk + (lane & 15)) * BPITCH + warp_n * WN + ni * 8);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni) mma_16816(acc[mi][ni], a[mi], b[ni]);
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
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < ntiles) load_stage(s, s);
            ak_cp_async_commit();
        }
        for (int t = 0; t < ntiles; ++t) {
            ak_cp_async_wait<(STAGES >= 2 ? STAGES - 2 : 0)>();
            __syncthreads();
            const int next = t + STAGES - 1;
            if (next < ntiles) load_stage(next % STAGES, next);
            ak_cp_async_commit();
            compute_stage(t % STAGES);
        }
        ak_cp_async_wait<0>();
    }

    // Epilogue. Accumulator e of an mma tile sits at row (lane / 4) + 8 (e / 2), column
    // 2 (lane % 4) + (e % 2) of that 16 x 8 tile.
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = block_m + warp_m * WM + mi * 16 + g + 8 * h;
                const int col = block_n + warp_n * WN + ni * 8 + 2 * t4;
                if (row >= M) continue;
                float* dst = C + (size_t)row * N + col;
                const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                if (SPLIT_K == 1) {
                    if (c_vec && col + 1 < N) {
                        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
                    } else {
                        if (col < N) dst[0] = v0;
                        if (col + 1 < N) dst[1] = v1;
                    }
                } else {
                    if (col < N) atomicAdd(dst, v0);
                    if (col + 1 < N) atomicAdd(dst + 1, v1);
                }
            }
}
