// minductor C++ kernel prelude: scalar helpers with PyTorch semantics. No torch headers and
// no C++ standard library headers (<cmath> alone costs 0.2 s of g++ time): GCC builtins only,
// so a kernel compiles in about 0.1 s.
#pragma once
#include <stdint.h>
#include <omp.h>

template <typename T> struct mi_is_float { static constexpr bool value = false; };
template <> struct mi_is_float<float> { static constexpr bool value = true; };
template <> struct mi_is_float<double> { static constexpr bool value = true; };
template <typename A, typename B> struct mi_same { static constexpr bool value = false; };
template <typename A> struct mi_same<A, A> { static constexpr bool value = true; };
// A float converted to a signed integer type (T: int8 to int64): truncated toward zero within
// range; NaN and values out of int32/int64 range give its minimum, and narrower types go through
// int32 and wrap (uint8 of -3.7: 253), as x86's conversions, and so eager, do. A plain C++ cast
// is undefined there, and GCC took it so: (float)(int64_t)x became trunc(x) (3.4e38 where
// eager gives -9.2e18), (float)(uint8_t)x of -3.7 came out -3, and bfloat16 NaN converted to 0.
template <typename T, typename S> static inline T mi_to_int(S x) {
    if constexpr (!mi_is_float<S>::value) {
        return static_cast<T>(x);
    } else if constexpr (sizeof(T) < 4) {
        return static_cast<T>(mi_to_int<int32_t>(x));
    } else {
        constexpr S limit = sizeof(T) == 8 ? S(9223372036854775808.0) : S(2147483648.0);
        // out of range to -limit, which converts to the minimum (a select on the float: one on
        // the integer, 64-bit lanes under a 32-bit float mask, left GCC 12's loop scalar)
        const S below = x < limit ? x : -limit;
        return static_cast<T>(below >= -limit ? below : -limit);
    }
}
// An integer converted to a float (T: float or double), + 0 so that an integer zero is +0.0.
// With -fno-trapping-math GCC folds (float)(int64_t)x into trunc(x), which is -0.0 for x in
// (-1, 0): copysign(x, float(int(x))) took the wrong sign. GCC also drops a plain + 0 there (an
// integer converted is never -0.0), so the barrier keeps the add; a select on r == 0 instead
// left the loop scalar.
#ifdef __has_builtin
#if __has_builtin(__builtin_assoc_barrier)
#define MI_OPAQUE(x) __builtin_assoc_barrier(x)
#endif
#endif
#ifndef MI_OPAQUE
#define MI_OPAQUE(x) (x)
#endif
// A bool converts by a select: GCC 12 vectorized no loop that converted a bool to a float.
template <typename T, typename S> static inline T mi_to_float(S x) {
    if constexpr (mi_is_float<S>::value) return static_cast<T>(x);
    else if constexpr (mi_same<S, bool>::value) return x ? T(1) : T(0);
    else return MI_OPAQUE(static_cast<T>(x)) + T(0);
}

static inline int64_t mi_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mi_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
// the index of a masked load: element 0 where the mask is off, so the load can run
// unconditionally (a bitwise select keeps it branch-free: a vectorized gather)
static inline int64_t mi_masked_index(bool mask, int64_t index) { return index & -static_cast<int64_t>(mask); }

// A kernel's loop functions (MI_LOOP_FN) may be split over several translation units that
// compile in parallel and link into one library: the unit built with -DMI_PART=k holds the
// functions of part k. Without MI_PART the file is one ordinary unit.
#ifdef MI_PART
#define MI_LOOP_FN __attribute__((noinline, visibility("hidden")))
#define MI_IN_PART(k) ((k) == MI_PART)
#else
#define MI_LOOP_FN static __attribute__((noinline))
#define MI_IN_PART(k) 1
#endif

// Non-temporal stores of one 64-byte line (16 floats) at a 64-byte aligned address: the line
// goes to memory without being read first or kept in cache. mi_stream_head(p): floats from p
// to the next 64-byte boundary. A thread that streamed fences before its results are read.
typedef float mi_v16sf __attribute__((vector_size(64), aligned(64)));
typedef float mi_v8sf __attribute__((vector_size(32), aligned(32)));
typedef float mi_v4sf __attribute__((vector_size(16), aligned(16)));
static inline int64_t mi_stream_head(const float* p) { return static_cast<int64_t>((-reinterpret_cast<uintptr_t>(p) & 63) / 4); }
static inline void mi_stream_store(float* p, const float* line) {
#if defined(__AVX512F__)
    __builtin_ia32_movntps512(p, *reinterpret_cast<const mi_v16sf*>(line));
#elif defined(__AVX__)
    __builtin_ia32_movntps256(p, *reinterpret_cast<const mi_v8sf*>(line));
    __builtin_ia32_movntps256(p + 8, *reinterpret_cast<const mi_v8sf*>(line + 8));
#elif defined(__SSE__)
    for (int i = 0; i < 16; i += 4) __builtin_ia32_movntps(p + i, *reinterpret_cast<const mi_v4sf*>(line + i));
#else
    for (int i = 0; i < 16; i++) p[i] = line[i];
#endif
}
// a 64-byte line of any values (32 halves or bfloat16s) at a 64-byte aligned address
typedef long long mi_v8di __attribute__((vector_size(64), aligned(64)));
typedef long long mi_v4di __attribute__((vector_size(32), aligned(32)));
static inline void mi_stream_store_bits(void* p, const void* line) {
#if defined(__AVX512F__)
    __builtin_ia32_movntdq512(reinterpret_cast<mi_v8di*>(p), *reinterpret_cast<const mi_v8di*>(line));
#elif defined(__AVX__)
    __builtin_ia32_movntdq256(reinterpret_cast<mi_v4di*>(p), *reinterpret_cast<const mi_v4di*>(line));
    __builtin_ia32_movntdq256(reinterpret_cast<mi_v4di*>(p) + 1, *reinterpret_cast<const mi_v4di*>(line) + 1);
#else
    __builtin_memcpy(p, line, 64);
#endif
}
static inline int64_t mi_stream_head(const uint16_t* p) { return static_cast<int64_t>((-reinterpret_cast<uintptr_t>(p) & 63) / 2); }
static inline void mi_stream_fence() {
#if defined(__SSE__)
    __builtin_ia32_sfence();
#endif
}

// the math helpers are always inlined: a kernel of many loops can exhaust GCC's inlining
// budget for the unit, and one call left in a loop keeps the whole loop scalar
#define MI_MATH static inline __attribute__((always_inline))
// Kernels compile with -ffp-contract=off: GCC fuses a * b + c where it sees fit, and its
// choice differed between a loop's vector body and its scalar tail (one log in 2000 rounded
// differently), so a value two kernels recompute could differ. The math below fuses where it
// says so, the same in every loop.
#ifdef __FMA__
#define MI_MAD(a, b, c) __builtin_fmaf(a, b, c)
#else
#define MI_MAD(a, b, c) ((a) * (b) + (c))
#endif
#define MI_INF __builtin_inf()
#define MI_NAN __builtin_nan("")

// libm functions as float/double overloads: mi_c_<name>
#define MI_UNARY(name) \
    static inline float mi_c_##name(float x) { return __builtin_##name##f(x); } \
    static inline double mi_c_##name(double x) { return __builtin_##name(x); }
#define MI_BINARY(name) \
    static inline float mi_c_##name(float x, float y) { return __builtin_##name##f(x, y); } \
    static inline double mi_c_##name(double x, double y) { return __builtin_##name(x, y); }
MI_UNARY(sqrt)
MI_UNARY(floor) MI_UNARY(ceil)
MI_UNARY(trunc) MI_UNARY(nearbyint) MI_UNARY(fabs)
MI_BINARY(copysign) MI_BINARY(nextafter) MI_BINARY(fmod) MI_BINARY(pow)

#define MI_MAX_THREADS 256

// half and bfloat16 are stored as their 16 bits and computed as float. GCC 12 has no vector
// mode for _Float16 without AVX512-FP16, so no loop that loaded or stored one vectorized; the
// conversions below are integer and float arithmetic, which does.
typedef uint16_t mi_half;
typedef uint16_t mi_bf16;

// IEEE half bits to float, exactly (subnormals, infinities, NaN payloads): the exponent and
// mantissa shifted into a float's place are the half's value times 2^-112 (a subnormal half
// lands on a float subnormal), so one multiply by 2^112 rescales them; exponent 31 is infinity
// or NaN (no branch, no table)
static inline float mi_half_to_float(mi_half h) {
    const uint32_t m = (static_cast<uint32_t>(h) & 0x7FFFu) << 13;
    const float scaled = __builtin_bit_cast(float, m) * 0x1.0p112f;
    const uint32_t bits = m >= (0x7C00u << 13) ? (m | 0x7F800000u) : __builtin_bit_cast(uint32_t, scaled);
    return __builtin_bit_cast(float, bits | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

// float to IEEE half bits, rounded to nearest even as the hardware (and eager) rounds, overflow
// to infinity, NaN to the quiet NaN 0x7e00: the float addition of a power of two aligned to the
// half's last mantissa bit does the rounding
static inline mi_half mi_float_to_half(float f) {
    const uint32_t w = __builtin_bit_cast(uint32_t, f);
    const uint32_t shl1_w = w + w;
    const uint32_t bias_in = shl1_w & 0xFF000000u;
    const uint32_t bias = bias_in < 0x71000000u ? 0x71000000u : bias_in;
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    base = __builtin_bit_cast(float, (bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = __builtin_bit_cast(uint32_t, base);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return static_cast<mi_half>(((w & 0x80000000u) >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float mi_bf16_to_float(mi_bf16 v) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(v) << 16);
}

static inline mi_bf16 mi_float_to_bf16(float v) {
    uint32_t bits = __builtin_bit_cast(uint32_t, v);
    if (v != v) return static_cast<mi_bf16>(0x7fc0);
    uint32_t rounding = 0x7fff + ((bits >> 16) & 1);  // round to nearest even
    return static_cast<mi_bf16>((bits + rounding) >> 16);
}

static inline float mi_round_bf16(float v) { return mi_bf16_to_float(mi_float_to_bf16(v)); }
// v rounded to the nearest half, as a float, without the trip through the 16 bits (half the
// instructions; equal to mi_half_to_float(mi_float_to_half(v)) on 12M floats: every half, every
// midpoint and its neighbours, random bit patterns): a normal half keeps 11 significant bits (the
// float's low 13 mantissa bits rounded to nearest even; from 65520 on, infinity), a subnormal one
// is a multiple of 2^-24 (rounded by the float addition of 0.5)
static inline float mi_round_half(float v) {
    const float a = __builtin_fabsf(v);
    const uint32_t bits = __builtin_bit_cast(uint32_t, a);
    const float normal = __builtin_bit_cast(float, (bits + 0x0FFFu + ((bits >> 13) & 1u)) & ~0x1FFFu);
    const float big = normal >= 65536.0f ? __builtin_inff() : normal;
    const float r = a < 0x1.0p-14f ? (a + 0.5f) - 0.5f : big;
    return v != v ? v : __builtin_copysignf(r, v);
}

// N halves to floats and back (rounded to nearest even), a block at a time (codegen/cpp_f16c.py):
// F16C converts 16 (AVX-512) or 8 in one instruction, through GCC's builtins (<immintrin.h> costs
// 0.23 s of g++ time); without them, the arithmetic above. Both are exact; a NaN keeps its payload's
// top bits through F16C (as eager's vectorized conversion does), not 0x7e00. The float arrays are
// 64-byte aligned.
#ifndef __has_builtin
#define __has_builtin(x) 0
#endif
typedef float mi_v16sf __attribute__((vector_size(64), aligned(4)));
typedef short mi_v16hi __attribute__((vector_size(32), aligned(2)));
typedef float mi_v8sf __attribute__((vector_size(32), aligned(4)));
typedef short mi_v8hi __attribute__((vector_size(16), aligned(2)));
template <int N> static inline void mi_halves_to_floats(const mi_half* __restrict__ src, float* __restrict__ dst) {
#if defined(__AVX512F__) && __has_builtin(__builtin_ia32_vcvtph2ps512_mask)
    if constexpr (N % 16 == 0) {
        for (int k = 0; k < N; k += 16)
            *reinterpret_cast<mi_v16sf*>(dst + k) = __builtin_ia32_vcvtph2ps512_mask(
                *reinterpret_cast<const mi_v16hi*>(src + k), mi_v16sf{}, static_cast<unsigned short>(-1), 4);
        return;
    }
#endif
#if defined(__F16C__) && __has_builtin(__builtin_ia32_vcvtph2ps256)
    if constexpr (N % 8 == 0) {
        for (int k = 0; k < N; k += 8)
            *reinterpret_cast<mi_v8sf*>(dst + k) = __builtin_ia32_vcvtph2ps256(*reinterpret_cast<const mi_v8hi*>(src + k));
        return;
    }
#endif
    #pragma omp simd
    for (int k = 0; k < N; k++) dst[k] = mi_half_to_float(src[k]);
}
template <int N> static inline void mi_floats_to_halves(const float* __restrict__ src, mi_half* __restrict__ dst) {
#if defined(__AVX512F__) && __has_builtin(__builtin_ia32_vcvtps2ph512_mask)
    if constexpr (N % 16 == 0) {
        for (int k = 0; k < N; k += 16)  // imm 8: round to nearest even, no exceptions
            *reinterpret_cast<mi_v16hi*>(dst + k) = __builtin_ia32_vcvtps2ph512_mask(
                *reinterpret_cast<const mi_v16sf*>(src + k), 8, mi_v16hi{}, static_cast<unsigned short>(-1));
        return;
    }
#endif
#if defined(__F16C__) && __has_builtin(__builtin_ia32_vcvtps2ph256)
    if constexpr (N % 8 == 0) {
        for (int k = 0; k < N; k += 8)
            *reinterpret_cast<mi_v8hi*>(dst + k) = __builtin_ia32_vcvtps2ph256(*reinterpret_cast<const mi_v8sf*>(src + k), 8);
        return;
    }
#endif
    #pragma omp simd
    for (int k = 0; k < N; k++) dst[k] = mi_float_to_half(src[k]);
}

// N floats rounded to the nearest half in place, through the block conversions (F16C: two
// instructions a vector, where mi_round_half's arithmetic took about 17 cycles)
template <int N> static inline void mi_round_halves(float* __restrict__ values) {
    alignas(64) mi_half bits[N];
    mi_floats_to_halves<N>(values, bits);
    mi_halves_to_floats<N>(bits, values);
}

template <int N> static inline void mi_bf16s_to_floats(const mi_bf16* __restrict__ src, float* __restrict__ dst) {
    #pragma omp simd
    for (int k = 0; k < N; k++) dst[k] = mi_bf16_to_float(src[k]);
}
// With AVX512-BF16, 16 floats round to bfloat16 in one instruction (nearest even, as
// mi_float_to_bf16), except that it flushes subnormal inputs to zero and keeps a NaN's payload:
// a block holding either (one fpclass test) takes the arithmetic instead, so the bits are
// always mi_float_to_bf16's. Half the time of the arithmetic (0.062 against 0.12 ns a value).
template <int N> static inline void mi_floats_to_bf16s(const float* __restrict__ src, mi_bf16* __restrict__ dst) {
#if defined(__AVX512BF16__) && defined(__AVX512DQ__) && __has_builtin(__builtin_ia32_cvtneps2bf16_v16sf) \
    && __has_builtin(__builtin_ia32_fpclassps512_mask)
    if constexpr (N % 16 == 0) {
        for (int k = 0; k < N; k += 16) {
            mi_v16sf x;
            __builtin_memcpy(&x, src + k, sizeof(x));
            // classes 0x01 quiet NaN, 0x80 signaling NaN, 0x20 subnormal
            if (__builtin_expect(__builtin_ia32_fpclassps512_mask(x, 0xA1, static_cast<unsigned short>(-1)) != 0, 0)) {
                for (int j = 0; j < 16; j++) dst[k + j] = mi_float_to_bf16(src[k + j]);
            } else {
                auto bits = __builtin_ia32_cvtneps2bf16_v16sf(x);  // (its element type differs across GCC versions)
                __builtin_memcpy(dst + k, &bits, sizeof(bits));
            }
        }
        return;
    }
#endif
    #pragma omp simd
    for (int k = 0; k < N; k++) dst[k] = mi_float_to_bf16(src[k]);
}

// N floats (N a multiple of 32) rounded to halves or bfloat16s by the block conversions and
// written with streaming stores, a 64-byte line of 32 at a time, at a 64-byte aligned address
template <int N> static inline void mi_stream_store_halves(mi_half* p, const float* line) {
    alignas(64) mi_half bits[N];
    mi_floats_to_halves<N>(line, bits);
    for (int k = 0; k < N; k += 32) mi_stream_store_bits(p + k, bits + k);
}
template <int N> static inline void mi_stream_store_bf16s(mi_bf16* p, const float* line) {
    alignas(64) mi_bf16 bits[N];
    mi_floats_to_bf16s<N>(line, bits);
    for (int k = 0; k < N; k += 32) mi_stream_store_bits(p + k, bits + k);
}

// NaN-propagating maximum/minimum (torch.maximum semantics; a tie of -0 and +0 gives b, as
// eager's vectorized maximum does)
// (two selects of one compare each: early returns made GCC 12 give up some loops)
template <typename T> MI_MATH T mi_maximum(T a, T b) {
    if constexpr (mi_is_float<T>::value) {
        T r = !(a <= b) ? a : b;  // a when a is NaN
        return b != b ? b : r;
    } else {
        return a > b ? a : b;
    }
}
template <typename T> MI_MATH T mi_minimum(T a, T b) {
    if constexpr (mi_is_float<T>::value) {
        T r = !(a >= b) ? a : b;
        return b != b ? b : r;
    } else {
        return a < b ? a : b;
    }
}
// A max/min reduction's update of its accumulator acc by v, where the lanes are output columns
// (codegen/cpp_ops.reduction_code), NaN-propagating: `v > acc ? v : acc` is one vmaxps that
// keeps acc when either is NaN, and the NaN test is on v, off the accumulator's dependency
// chain (x.amax(0) at 4096^2, kernels alone: 1.45 -> 1.21 ms; a plain max without NaN, 0.75
// ms). A tie keeps acc (a reduction's -0/+0 is in no set order).
template <typename T> MI_MATH T mi_max_update(T acc, T v) {
    if constexpr (mi_is_float<T>::value) {
        T r = v > acc ? v : acc;
        return v != v ? v : r;
    } else {
        return v > acc ? v : acc;
    }
}
template <typename T> MI_MATH T mi_min_update(T acc, T v) {
    if constexpr (mi_is_float<T>::value) {
        T r = v < acc ? v : acc;
        return v != v ? v : r;
    } else {
        return v < acc ? v : acc;
    }
}

// Python-style floor division and modulo
// two's-complement negation without overflow (-INT_MIN == INT_MIN, as eager computes it)
template <typename T> static inline T mi_wrap_neg(T a) {
    return static_cast<T>(0ULL - static_cast<unsigned long long>(a));
}
// integer division by zero: flag it for the wrapper to raise eager's ZeroDivisionError
// Checks record a failure in the kernel's local flag ``mi_bad`` (1: index out of range,
// 2: integer division by zero) without a branch, so checked loops still vectorize; the flag
// reaches the wrapper's mi_err once per function.
template <typename T> static inline void mi_check_divisor(T b, int64_t& bad) {
    if constexpr (!mi_is_float<T>::value) bad |= (b == 0) ? 2 : 0;
}

MI_MATH float mi_fmodf(float a, float b);  // minductor_libm.h
// Python's floor division and remainder of floats, as eager computes them: from the exact fmod,
// branch-free for float (selects of floats: a branch or a compare of two bools kept loops scalar)
MI_MATH float mi_floordivf(float a, float b) {
    float mod = mi_fmodf(a, b);
    float div = (a - mod) / b;
    div = mod != 0.0f ? (__builtin_copysignf(1.0f, b) != __builtin_copysignf(1.0f, mod) ? div - 1.0f : div) : div;
    float fl = __builtin_floorf(div);
    fl = div - fl > 0.5f ? fl + 1.0f : fl;
    fl = div == 0.0f ? __builtin_copysignf(0.0f, a / b) : fl;
    return b == 0.0f ? a / b : fl;
}
MI_MATH float mi_modf(float a, float b) {
    float m = mi_fmodf(a, b);
    return m == 0.0f ? m : (__builtin_copysignf(1.0f, m) != __builtin_copysignf(1.0f, b) ? m + b : m);
}
template <typename T> static inline T mi_floordiv(T a, T b) {
    if constexpr (mi_same<T, float>::value) {
        return mi_floordivf(a, b);
    } else if constexpr (mi_is_float<T>::value) {
        if (b == 0) return a / b;
        T mod = mi_c_fmod(a, b);
        T div = (a - mod) / b;
        if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
        if (div == 0) return mi_c_copysign(T(0), a / b);
        T floordiv = mi_c_floor(div);
        if (div - floordiv > T(0.5)) floordiv += 1;
        return floordiv;
    } else {
        if (b == 0) return 0;
        if (b == T(-1)) return mi_wrap_neg(a);  // INT_MIN / -1 traps (SIGFPE); eager wraps
        T q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
        return q;
    }
}
template <typename T> static inline T mi_truncdiv(T a, T b) {
    if constexpr (mi_is_float<T>::value) {
        return mi_c_trunc(a / b);
    } else {
        return b == 0 ? 0 : (b == T(-1) ? mi_wrap_neg(a) : a / b);
    }
}
template <typename T> static inline T mi_mod(T a, T b) {
    if constexpr (mi_same<T, float>::value) {
        return mi_modf(a, b);
    } else if constexpr (mi_is_float<T>::value) {
        T m = mi_c_fmod(a, b);
        if (m != 0 && ((b < 0) != (m < 0))) m += b;
        return m;
    } else {
        if (b == 0 || b == T(-1)) return 0;
        T m = a % b;
        if (m != 0 && ((b < 0) != (m < 0))) m += b;
        return m;
    }
}
template <typename T> static inline T mi_fmod(T a, T b) {
    if constexpr (mi_same<T, float>::value) return mi_fmodf(a, b);
    else if constexpr (mi_is_float<T>::value) return mi_c_fmod(a, b);
    else return (b == 0 || b == T(-1)) ? 0 : a % b;
}
MI_MATH float mi_powf(float x, float y);  // minductor_libm.h
template <typename T> static inline T mi_pow(T a, T b) {
    if constexpr (mi_same<T, float>::value) {
        return mi_powf(a, b);
    } else if constexpr (mi_is_float<T>::value) {
        return mi_c_pow(a, b);
    } else {
        if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b % 2) ? -1 : 1) : 0);
        T result = 1;
        while (b) { if (b & 1) result *= a; a *= a; b >>= 1; }
        return result;
    }
}
template <typename T> static inline T mi_fma(T a, T b, T c) {
    if constexpr (mi_same<T, float>::value) return __builtin_fmaf(a, b, c);
    else if constexpr (mi_same<T, double>::value) return __builtin_fma(a, b, c);
    else return static_cast<T>(a * b + c);
}
template <typename T> MI_MATH T mi_sign(T a) {
    if constexpr (mi_is_float<T>::value) {
        if (a != a) return a;
    }
    return static_cast<T>((T(0) < a) - (a < T(0)));
}
// Branch-free float32 math so loops under `omp simd` vectorize (libm calls do not).
// Accurate to a few ulp; NaN/inf behave as in libm. double uses libm.
// 2 e^r for |r| <= ln2 / 2 (the factor 2 makes mi_exp's scale 2^(n-1), so e^x just below
// FLT_MAX stays finite): 2 + 2r + r^2 q(r), q of degree 4 fitted for the least largest
// relative error (3.6e-9 in exact arithmetic; evaluated in float32, 8.4e-8 at most, as the
// degree-5 q it replaced: a multiply-add less a vector)
MI_MATH float mi_exp_poly(float r) {
    float p = 2.7629081160e-3f;
    p = MI_MAD(p, r, 1.6737490892e-2f);
    p = MI_MAD(p, r, 8.3336777985e-2f);
    p = MI_MAD(p, r, 3.3333042264e-1f);
    p = MI_MAD(p, r, 9.9999988079e-1f);
    p = MI_MAD(p, r, 2.0f);
    return MI_MAD(p, r, 2.0f);
}
MI_MATH float mi_exp(float x) {
    // relative error < 1e-7 where e^x is a normal float; results below 2^-125 flush to 0.
    // n = rint(x / ln2) from the 1.5 * 2^23 shifter, whose low mantissa bits hold n: no
    // rounding or conversion instruction. The scale 2^(n-1) is a normal float for x in
    // [-87.5, 88.75]; outside, two selects on x give 0 and infinity (NaN passes both).
    // Clamping x to that range instead cost GCC 12 four compares, a mask op and two blends a
    // vector (the selects: two compares and a blend): softmax's exp loop 117 -> 105
    // instructions per 64 floats, the same results.
    float t = MI_MAD(x, 1.44269504088896341f, 12582912.0f);
    float n = t - 12582912.0f;
    float r = MI_MAD(n, -0.693359375f, x);  // x - n ln2, ln2 in two parts
    r = MI_MAD(n, 2.12194440e-4f, r);
    int32_t scale = (__builtin_bit_cast(int32_t, t) + 126) << 23;  // 2^(n-1); 0 for n = -126
    float e = mi_exp_poly(r) * __builtin_bit_cast(float, scale);
    e = x < -87.5f ? 0.0f : e;
    return x > 88.72283935546875f ? __builtin_inff() : e;  // (above log(FLT_MAX))
}
static inline double mi_exp(double x) { return __builtin_exp(x); }

// log's reduction: x = 2^fe (1 + m), m in [sqrt(1/2) - 1, sqrt(2) - 1] (subnormals scaled first).
// Every select is on floats, and NaN/negative is one compare (mi_log_specials): mixing int
// selects and an || of compares made GCC 12 give up vectorizing loops where log follows
// another function
MI_MATH float mi_log_reduce(float x, float& fe) {
    bool den = x < 1.17549435e-38f;
    float xs = den ? x * 8388608.0f : x;
    int32_t bits = __builtin_bit_cast(int32_t, xs);
    fe = static_cast<float>(((bits >> 23) & 0xff) - 126);
    fe = den ? fe - 23.0f : fe;
    float m = __builtin_bit_cast(float, (bits & 0x007fffff) | 0x3f000000);
    bool small = m < 0.707106781186547524f;
    fe = small ? fe - 1.0f : fe;
    return small ? m + m - 1.0f : m - 1.0f;
}
// log(1 + m) - m + m^2 / 2, for z = m^2
MI_MATH float mi_log_tail(float m, float z) {
    float y = 7.0376836292E-2f;
    y = MI_MAD(y, m, -1.1514610310E-1f);
    y = MI_MAD(y, m, 1.1676998740E-1f);
    y = MI_MAD(y, m, -1.2420140846E-1f);
    y = MI_MAD(y, m, 1.4249322787E-1f);
    y = MI_MAD(y, m, -1.6668057665E-1f);
    y = MI_MAD(y, m, 2.0000714765E-1f);
    y = MI_MAD(y, m, -2.4999993993E-1f);
    y = MI_MAD(y, m, 3.3333331174E-1f);
    return y * m * z;
}
// -inf at 0, inf at inf, NaN for NaN and negatives
MI_MATH float mi_log_specials(float x, float out) {
    out = x == 0.0f ? -__builtin_inff() : out;
    out = x == __builtin_inff() ? x : out;
    return x >= 0.0f ? out : __builtin_nanf("");
}
MI_MATH float mi_log(float x) {
    float fe, m = mi_log_reduce(x, fe);
    float z = m * m;
    float y = mi_log_tail(m, z);
    y = MI_MAD(-2.12194440e-4f, fe, y);
    y = MI_MAD(-0.5f, z, y);
    return mi_log_specials(x, MI_MAD(0.693359375f, fe, m + y));
}
static inline double mi_log(double x) { return __builtin_log(x); }

MI_MATH float mi_tanh(float x) {
    // relative error < 3.1e-7 (5 ulp near +-1): x P(x^2) / Q(x^2) on (-7.9, 7.9) (odd numerator
    // of degree 13, even denominator of degree 6: a minimax fit of the relative error, by
    // Lawson-weighted least squares in float64), and +-1 from 7.9 on (tanh(7.9) is 1 - 2.7e-7).
    // Every float in [2, 7.9] checked: the quotient never exceeds 1, with or without FMA. One
    // division and no exp, against 1 - 2 / (e^2x + 1) with a polynomial near 0: whole calls at
    // 2048x4096, 2 threads, tanh 1.51 -> 1.05 ms (erf's time: memory-bound), GELU-tanh 2.15 ->
    // 1.08. (A clamp of the quotient to [-1, 1] cost as much as the rest of the function.)
    // Inf saturates; NaN fails the test and propagates through the quotient
    float z = x * x;
    float p = -1.192433603e-13f;
    p = MI_MAD(p, z, 6.482787918e-11f);
    p = MI_MAD(p, z, -2.252539133e-08f);
    p = MI_MAD(p, z, 1.168949984e-05f);
    p = MI_MAD(p, z, 3.153645433e-03f);
    p = MI_MAD(p, z, 1.312813014e-01f);
    p = MI_MAD(p, z, 1.0f);
    float q = 2.619328443e-04f;
    q = MI_MAD(q, z, 2.469187789e-02f);
    q = MI_MAD(q, z, 4.646145999e-01f);
    q = MI_MAD(q, z, 1.0f);
    float r = x * (p / q);  // p / q first: x p would go subnormal for tiny x
    return 7.9f <= __builtin_fabsf(x) ? __builtin_copysignf(1.0f, x) : r;
}
static inline double mi_tanh(double x) { return __builtin_tanh(x); }

MI_MATH float mi_erf(float x) {
    // relative error < 4e-7: x P(x^2) / Q(x^2) on [-4, 4] (odd numerator of degree 13, even
    // denominator of degree 8; the form XLA uses for float32), and +-1 beyond (erf(4) rounds to 1
    // in float32). One division, no exp, no branch; NaN passes the clamps (min/max returning
    // their second operand) and propagates
    float xc = 4.0f < x ? 4.0f : x;
    xc = -4.0f > xc ? -4.0f : xc;
    float z = xc * xc;
    float p = -2.72614225801306e-10f;
    p = MI_MAD(p, z, 2.77068142495902e-08f);
    p = MI_MAD(p, z, -2.10102402082508e-06f);
    p = MI_MAD(p, z, -5.69250639462346e-05f);
    p = MI_MAD(p, z, -7.34990630326855e-04f);
    p = MI_MAD(p, z, -2.95459980854025e-03f);
    p = MI_MAD(p, z, -1.60960333262415e-02f);
    float q = -1.45660718464996e-05f;
    q = MI_MAD(q, z, -2.13374055278905e-04f);
    q = MI_MAD(q, z, -1.68282697438203e-03f);
    q = MI_MAD(q, z, -7.37332916720468e-03f);
    q = MI_MAD(q, z, -1.42647390514189e-02f);
    return xc * (p / q);  // p / q first: x p would go subnormal for tiny x
}
static inline double mi_erf(double x) { return __builtin_erf(x); }
#include "minductor_libm.h"

#include "minductor_sincos.h"
#include "minductor_window.h"
#include "minductor_random.h"

template <typename T> MI_MATH T mi_sigmoid(T a) { return T(1) / (T(1) + mi_exp(-a)); }
// the element type of a table of values a loop reads by its index (cpp_rewrites.py): bools as
// int32, since GCC 12 vectorized no loop that read a bool table and gathered int64 values
// under its masks (a max_pool2d backward: "no vectype for stmt" on the int64 load)
template <typename T> struct mi_table_s { using type = T; };
template <> struct mi_table_s<bool> { using type = int32_t; };
template <typename T> using mi_table_t = typename mi_table_s<T>::type;
template <bool Wide> struct mi_bits_s { using type = uint64_t; };
template <> struct mi_bits_s<false> { using type = uint32_t; };
template <typename T> MI_MATH T mi_relu(T a) {
    // the bits of a, cleared where a < 0 (NaN is not < 0, so it passes; -0 stays, as eager's). As a
    // select of a or 0 (or with an early return for NaN), GCC 12 left loops unvectorized: one
    // with an exp and a sin, and a relu'd 2x2 max pool storing only its int64 indices (5.4 ms
    // scalar against 0.1 ms)
    if constexpr (mi_is_float<T>::value) {
        using U = typename mi_bits_s<sizeof(T) == 8>::type;
        return __builtin_bit_cast(T, __builtin_bit_cast(U, a) & ~(U(0) - U(a < T(0))));
    } else {
        return a > T(0) ? a : T(0);
    }
}
template <typename T> MI_MATH T mi_abs(T a) {
    if constexpr (mi_same<T, bool>::value) return a;
    else if constexpr (mi_is_float<T>::value) return mi_c_fabs(a);
    else return a < 0 ? -a : a;
}
template <typename T> MI_MATH T mi_rsqrt(T a) { return T(1) / mi_c_sqrt(a); }
template <typename T> MI_MATH T mi_reciprocal(T a) { return T(1) / a; }
template <typename T> static inline auto mi_shl(T a, T b) {
    return (b < 0 || b >= T(sizeof(T) * 8)) ? T(0) : static_cast<T>(a << b);
}
template <typename T> static inline auto mi_shr(T a, T b) {
    if (b < 0 || b >= T(sizeof(T) * 8)) return static_cast<T>(a < 0 ? -1 : 0);
    return static_cast<T>(a >> b);
}
template <typename T> static inline T mi_erfinv(T y) {
    // Giles' approximation refined by two Newton steps on erf
    double x, w = -__builtin_log((1.0 - y) * (1.0 + y));
    if (y <= -1) return static_cast<T>(-MI_INF);
    if (y >= 1) return static_cast<T>(MI_INF);
    if (w < 5.0) {
        w -= 2.5;
        x = 2.81022636e-08; x = 3.43273939e-07 + x * w; x = -3.5233877e-06 + x * w;
        x = -4.39150654e-06 + x * w; x = 0.00021858087 + x * w; x = -0.00125372503 + x * w;
        x = -0.00417768164 + x * w; x = 0.246640727 + x * w; x = 1.50140941 + x * w;
    } else {
        w = __builtin_sqrt(w) - 3.0;
        x = -0.000200214257; x = 0.000100950558 + x * w; x = 0.00134934322 + x * w;
        x = -0.00367342844 + x * w; x = 0.00573950773 + x * w; x = -0.0076224613 + x * w;
        x = 0.00943887047 + x * w; x = 1.00167406 + x * w; x = 2.83297682 + x * w;
    }
    x *= y;
    for (int i = 0; i < 2; i++) {
        double err = __builtin_erf(x) - y;
        x -= err / (1.1283791670955126 * __builtin_exp(-x * x));
    }
    return static_cast<T>(x);
}

// Reduction accumulators -------------------------------------------------------------

template <typename T> static inline T mi_lowest() {
    if constexpr (mi_is_float<T>::value) return static_cast<T>(-MI_INF);
    else if constexpr (mi_same<T, bool>::value) return false;
    else if constexpr (static_cast<T>(-1) < static_cast<T>(0))
        return static_cast<T>(static_cast<uint64_t>(1) << (sizeof(T) * 8 - 1));
    else return static_cast<T>(0);
}
template <typename T> static inline T mi_highest() {
    if constexpr (mi_is_float<T>::value) return static_cast<T>(MI_INF);
    else if constexpr (mi_same<T, bool>::value) return true;
    else return static_cast<T>(~mi_lowest<T>());
}
template <typename T> static inline bool mi_isinf(T v) {
    if constexpr (mi_is_float<T>::value) return __builtin_isinf(v);
    else return false;
}
// The sign bit read from the bits: GCC 12 vectorizing __builtin_signbit of floats widened from
// bfloat16 (its bits shifted into a float's high half) stopped with an internal compiler error
// (an unrecognizable vector shift), so torch.signbit of any bfloat16 tensor failed to compile.
template <typename T> static inline bool mi_signbit(T v) {
    if constexpr (mi_same<T, float>::value) return __builtin_bit_cast(uint32_t, v) >> 31;
    else if constexpr (mi_same<T, double>::value) return __builtin_bit_cast(uint64_t, v) >> 63;
    else return v < 0;
}

template <typename T> struct MiArg {
    T value;
    int64_t index;
};
template <typename T> static inline bool mi_isnan(T v) {
    if constexpr (mi_is_float<T>::value) return v != v;
    else return false;
}
// combine two (value, index) candidates; NaN wins, ties go to the smaller index
template <typename T, bool Max> static inline MiArg<T> mi_arg_combine(MiArg<T> a, MiArg<T> b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    bool an = mi_isnan(a.value), bn = mi_isnan(b.value);
    if (an || bn) {
        if (an && bn) return a.index <= b.index ? a : b;
        return an ? a : b;
    }
    bool a_better = Max ? a.value > b.value : a.value < b.value;
    bool b_better = Max ? b.value > a.value : b.value < a.value;
    if (a_better) return a;
    if (b_better) return b;
    return a.index <= b.index ? a : b;
}
// argmax/argmin along a row, value and index lanes in separate arrays (codegen/cpp.py), the
// index growing within a lane: a branch-free select per element. NaN wins and keeps its first
// index; a tie keeps the earlier index; an empty lane (index -1) takes the first value.
template <typename T, bool Max> static inline void mi_arg_soa_update(T& a, int64_t& ai, T v, int64_t i) {
    const bool take = (Max ? v > a : v < a) || (v != v && a == a) || ai < 0;
    a = take ? v : a;
    ai = take ? i : ai;
}
template <typename T> static inline MiArg<T> mi_argmax_update(MiArg<T> acc, T v, int64_t i) {
    return mi_arg_combine<T, true>(acc, MiArg<T>{v, i});
}
template <typename T> static inline MiArg<T> mi_argmin_update(MiArg<T> acc, T v, int64_t i) {
    return mi_arg_combine<T, false>(acc, MiArg<T>{v, i});
}

template <typename T> struct MiWelford {
    T mean;
    T m2;
    T weight;
};
template <typename T> static inline MiWelford<T> mi_welford_update(MiWelford<T> acc, T v) {
    T weight = acc.weight + T(1);
    T delta = v - acc.mean;
    T mean = acc.mean + delta / weight;
    return MiWelford<T>{mean, acc.m2 + delta * (v - mean), weight};
}
// the same update given rw = 1 / (acc.weight + 1), computed once for all lanes
template <typename T> static inline MiWelford<T> mi_welford_update_rw(MiWelford<T> acc, T v, T rw) {
    T delta = v - acc.mean;
    T mean = acc.mean + delta * rw;
    return MiWelford<T>{mean, acc.m2 + delta * (v - mean), acc.weight + T(1)};
}
template <typename T> static inline void mi_welford_soa_update(T& mean, T& m2, T v, T rw) {
    T delta = v - mean;
    mean += delta * rw;
    m2 += delta * (v - mean);
}
// mi_welford_update on a lane of separate arrays (outer lanes: vectorizes across them)
template <typename T> static inline void mi_welford_soa_update_w(T& mean, T& m2, T& weight, T v) {
    weight += T(1);
    T delta = v - mean;
    mean += delta / weight;
    m2 += delta * (v - mean);
}
template <typename T> static inline MiWelford<T> mi_welford_combine(MiWelford<T> a, MiWelford<T> b) {
    if (a.weight == 0) return b;
    if (b.weight == 0) return a;
    T weight = a.weight + b.weight;
    T delta = b.mean - a.mean;
    T nb = b.weight / weight;
    return MiWelford<T>{a.mean + delta * nb, a.m2 + b.m2 + delta * delta * a.weight * nb, weight};
}

static inline void mi_index_error(const char* kernel, int64_t index, int64_t size) {
    (void)kernel; (void)index; (void)size;
    // out-of-bounds indirect index: clamp is not PyTorch's semantics, so trap loudly
    __builtin_trap();
}

// Transpose a 16x16 block of 4-byte values: dst[b * dstride + a] = src[a * stride + b]. Staging a
// transposed operand this way instead of loading it with a 16 KB stride made x.t() + y at 4096
// ~3x faster. Written with GCC's vector extension at the target's vector width: without
// AVX-512 a 64-byte shuffle is split into scalar moves (700 of them), so AVX2 and older
// targets transpose the four 8x8 quarters with 32-byte vectors instead.
#define MI_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#ifdef __AVX512F__
typedef uint32_t mi_u32x16 __attribute__((vector_size(64)));
// sixteen row loads, four rounds of two-input shuffles (32-bit pairs, 64-bit pairs, 128-bit and
// 256-bit blocks; vpermt2ps), sixteen row stores
template <typename T> MI_MATH void mi_transpose16(const T* __restrict__ src, int64_t stride, T* __restrict__ dst, int64_t dstride) {
    static_assert(sizeof(T) == 4, "mi_transpose16 moves 4-byte values");
    mi_u32x16 r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) __builtin_memcpy(&r[i], src + i * stride, 64);
    for (int k = 0; k < 8; k++) {  // interleave 32-bit values of rows 2k, 2k+1 in each 128-bit lane
        t[2 * k] = MI_SHUF(r[2 * k], r[2 * k + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        t[2 * k + 1] = MI_SHUF(r[2 * k], r[2 * k + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
    for (int g = 0; g < 4; g++) {  // u[4g + m]: lane l holds column 4l + m of rows 4g .. 4g + 3
        u[4 * g] = MI_SHUF(t[4 * g], t[4 * g + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        u[4 * g + 1] = MI_SHUF(t[4 * g], t[4 * g + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        u[4 * g + 2] = MI_SHUF(t[4 * g + 1], t[4 * g + 3], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        u[4 * g + 3] = MI_SHUF(t[4 * g + 1], t[4 * g + 3], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    for (int m = 0; m < 4; m++) {  // gather lane l of u[m], u[4 + m], u[8 + m], u[12 + m]: column 4l + m
        mi_u32x16 e0 = MI_SHUF(u[m], u[4 + m], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        mi_u32x16 o0 = MI_SHUF(u[m], u[4 + m], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        mi_u32x16 e1 = MI_SHUF(u[8 + m], u[12 + m], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        mi_u32x16 o1 = MI_SHUF(u[8 + m], u[12 + m], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        r[m] = MI_SHUF(e0, e1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        r[8 + m] = MI_SHUF(e0, e1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        r[4 + m] = MI_SHUF(o0, o1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        r[12 + m] = MI_SHUF(o0, o1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    }
    for (int i = 0; i < 16; i++) __builtin_memcpy(dst + i * dstride, &r[i], 64);
}
#else
typedef uint32_t mi_u32x8 __attribute__((vector_size(32)));
// dst[b * dstride + a] = src[a * stride + b] for an 8x8 block: unpack 32-bit pairs, shuffle 64-bit
// pairs, swap 128-bit halves (vunpcklps/vshufps/vperm2f128)
template <typename T> MI_MATH void mi_transpose8(const T* __restrict__ src, int64_t stride, T* __restrict__ dst, int64_t dstride) {
    mi_u32x8 r[8], t[8], u[8];
    for (int i = 0; i < 8; i++) __builtin_memcpy(&r[i], src + i * stride, 32);
    for (int k = 0; k < 4; k++) {
        t[2 * k] = MI_SHUF(r[2 * k], r[2 * k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[2 * k + 1] = MI_SHUF(r[2 * k], r[2 * k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int g = 0; g < 2; g++) {  // u[4g + m]: columns m and m + 4 of rows 4g .. 4g + 3
        u[4 * g] = MI_SHUF(t[4 * g], t[4 * g + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[4 * g + 1] = MI_SHUF(t[4 * g], t[4 * g + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[4 * g + 2] = MI_SHUF(t[4 * g + 1], t[4 * g + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[4 * g + 3] = MI_SHUF(t[4 * g + 1], t[4 * g + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int m = 0; m < 4; m++) {
        r[m] = MI_SHUF(u[m], u[4 + m], 0, 1, 2, 3, 8, 9, 10, 11);
        r[4 + m] = MI_SHUF(u[m], u[4 + m], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (int i = 0; i < 8; i++) __builtin_memcpy(dst + i * dstride, &r[i], 32);
}
template <typename T> MI_MATH void mi_transpose16(const T* __restrict__ src, int64_t stride, T* __restrict__ dst, int64_t dstride) {
    static_assert(sizeof(T) == 4, "mi_transpose16 moves 4-byte values");
    for (int a = 0; a < 16; a += 8)
        for (int b = 0; b < 16; b += 8) mi_transpose8(src + a * stride + b, stride, dst + b * dstride + a, dstride);
}
#endif
#undef MI_SHUF
