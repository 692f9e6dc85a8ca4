// ---- autokernel: helpers shared by every template (kernels/src/cuda/templates/common.cuh) ----
// No #include: NVRTC compiles this with its built-in declarations only, so the templates build
// with nothing but libnvrtc (no CUDA toolkit headers). bf16 values travel as raw 16-bit
// patterns (unsigned short); the tensor-core and async-copy instructions are inline PTX.

#define AK_NEG_INF __int_as_float(0xff800000)
#define AK_FULL_MASK 0xffffffffu

typedef unsigned short ak_bf16;

// bf16 bits -> f32 (exact).
__device__ __forceinline__ float ak_bf16_to_f32(ak_bf16 h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// f32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN).
__device__ __forceinline__ ak_bf16 ak_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (ak_bf16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ak_bf16)(u >> 16);
}

// Shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ unsigned int ak_smem_addr(const void* p) {
    unsigned int addr;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\n"
                 : "=r"(addr)
                 : "l"(p));
    return addr;
}

// Copies BYTES (4, 8 or 16) from global to shared memory, asynchronously on sm_80+.
// When `pred` is false nothing is read and the destination is zero-filled; `gmem` must still
// be a valid address (callers pass the matrix base).
template <int BYTES>
__device__ __forceinline__ void ak_cp_async(void* smem, const void* gmem, bool pred) {
    static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
#if __CUDA_ARCH__ >= 800
    const unsigned int dst = ak_smem_addr(smem);
    const int src_bytes = pred ? BYTES : 0;
    if constexpr (BYTES == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :
                     : "r"(dst), "l"(gmem), "r"(src_bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :
                     : "r"(dst), "l"(gmem), "n"(BYTES), "r"(src_bytes));
    }
#else
    if constexpr (BYTES == 16) {
        *reinterpret_cast<uint4*>(smem) = pred ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
    } else if constexpr (BYTES == 8) {
        *reinterpret_cast<uint2*>(smem) = pred ? *reinterpret_cast<const uint2*>(gmem) : make_uint2(0, 0);
    } else {
        *reinterpret_cast<unsigned int*>(smem) = pred ? *reinterpret_cast<const unsigned int*>(gmem) : 0u;
    }
#endif
}

// Closes the current group of cp.async copies.
__device__ __forceinline__ void ak_cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void ak_cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ float ak_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(AK_FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ float ak_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(AK_FULL_MASK, v, o);
    return v;
}
// ---- end of common helpers ----
