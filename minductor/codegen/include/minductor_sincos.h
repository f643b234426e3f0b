// sin, cos and tan of the C++ prelude (included by minductor_prelude.h after exp, log and the
// libm header): glibc's libmvec where enabled (MI_LIBMVEC), else the prelude's own reduction
// by pi/2 and polynomials.
#pragma once

#ifdef MI_LIBMVEC
// glibc's libmvec: vector sinf/cosf, within 2 ulp for every argument, huge ones included. Its
// variants do not round alike: scalar sinf differs from _ZGVeN16v_sinf on 23% of arguments, the
// SSE variant on 25%. A value two kernels recompute must round the same in both (a loop's tail
// against a vector body: an amax's tie mask over sin(x) found no tie, NaN gradients), so
// mi_vsinf/mi_vcosf declare vector variants of every width, and these and the scalar function
// all call libmvec's widest variant for the target, the unused lanes zero.
#if defined(__AVX512F__)
#define MI_MVEC_LANES 16
#define MI_MVEC(f) _ZGVeN16v_##f
#elif defined(__AVX2__)
#define MI_MVEC_LANES 8
#define MI_MVEC(f) _ZGVdN8v_##f
#elif defined(__AVX__)
#define MI_MVEC_LANES 8
#define MI_MVEC(f) _ZGVcN8v_##f
#else
#define MI_MVEC_LANES 4
#define MI_MVEC(f) _ZGVbN4v_##f
#endif
typedef float mi_mvec_t __attribute__((vector_size(4 * MI_MVEC_LANES)));
typedef float mi_mvec4_t __attribute__((vector_size(16)));
typedef float mi_mvec8_t __attribute__((vector_size(32)));
typedef float mi_mvec16_t __attribute__((vector_size(64)));
extern "C" mi_mvec_t MI_MVEC(sinf)(mi_mvec_t);
extern "C" mi_mvec_t MI_MVEC(cosf)(mi_mvec_t);
// the variant `mangled` (GCC's vector-function ABI name) of `name`, T values in and out; weak,
// since every translation unit of a kernel (MI_PART) defines it
#define MI_MVEC_VARIANT(mangled, f, T) \
    extern "C" __attribute__((visibility("hidden"), used, weak)) T mangled(T x) { \
        mi_mvec_t w = {}; \
        __builtin_memcpy(&w, &x, sizeof x); \
        w = MI_MVEC(f)(w); \
        T out; \
        __builtin_memcpy(&out, &w, sizeof out); \
        return out; \
    }
#if defined(__AVX512F__)
#define MI_MVEC_WIDE_VARIANTS(name, f) MI_MVEC_VARIANT(_ZGVcN8v_##name, f, mi_mvec8_t) \
    MI_MVEC_VARIANT(_ZGVdN8v_##name, f, mi_mvec8_t) MI_MVEC_VARIANT(_ZGVeN16v_##name, f, mi_mvec16_t)
#elif defined(__AVX2__)
#define MI_MVEC_WIDE_VARIANTS(name, f) MI_MVEC_VARIANT(_ZGVcN8v_##name, f, mi_mvec8_t) \
    MI_MVEC_VARIANT(_ZGVdN8v_##name, f, mi_mvec8_t)
#elif defined(__AVX__)
#define MI_MVEC_WIDE_VARIANTS(name, f) MI_MVEC_VARIANT(_ZGVcN8v_##name, f, mi_mvec8_t)
#else
#define MI_MVEC_WIDE_VARIANTS(name, f)
#endif
// The scalar function is a plain definition under another name, and an assembler alias gives
// it the declared name: GCC takes a function defined in the unit under the simd attribute as
// one whose variants it derives itself (and from an alias it derives none: no loop vectorizes).
// A unit that calls no sin (cos) defines MI_NO_SIN (MI_NO_COS; cpp_unit.py): the definitions
// of both cost ~12 ms of g++ time a unit.
#define MI_MVEC_DECLARE(name) \
    extern "C" float name(float) __attribute__((simd("notinbranch"), nothrow, const, visibility("hidden")));
#define MI_MVEC_DEFINE(name, f) \
    MI_MVEC_VARIANT(_ZGVbN4v_##name, f, mi_mvec4_t) \
    MI_MVEC_WIDE_VARIANTS(name, f) \
    MI_MVEC_VARIANT(name##_scalar, f, float) \
    __asm__(".weak " #name "\n.hidden " #name "\n.set " #name ", " #name "_scalar\n");
MI_MVEC_DECLARE(mi_vsinf)
MI_MVEC_DECLARE(mi_vcosf)
#ifndef MI_NO_SIN
MI_MVEC_DEFINE(mi_vsinf, sinf)
#endif
#ifndef MI_NO_COS
MI_MVEC_DEFINE(mi_vcosf, cosf)
#endif
MI_MATH float mi_sin(float x) { return mi_vsinf(x); }
MI_MATH float mi_cos(float x) { return mi_vcosf(x); }
MI_MATH float mi_tan(float x) { return mi_sin(x) / mi_cos(x); }  // (cpp_unit keeps both defined)
#else
// sin/cos: quadrant from a double-precision reduction by pi/2, then float polynomials
MI_MATH float mi_sincos_poly(float r, int32_t q, bool want_cos) {
    float z = r * r;
    float s = MI_MAD(r * z, MI_MAD(z, MI_MAD(z, -1.9515295891E-4f, 8.3321608736E-3f), -1.6666654611E-1f), r);
    float c = MI_MAD(z * z, MI_MAD(z, MI_MAD(z, 2.443315711809948E-5f, -1.388731625493765E-3f), 4.166664568298827E-2f),
                     MI_MAD(-0.5f, z, 1.0f));
    int32_t k = (q + (want_cos ? 1 : 0)) & 3;
    float v = (k & 1) ? c : s;
    return (k & 2) ? -v : v;
}
MI_MATH void mi_reduce_pi2(float x, float& r, int32_t& q) {
    double xd = static_cast<double>(x);
    double k = __builtin_floor(xd * 0.63661977236758134308 + 0.5);
    double rd = xd - k * 1.5707963267341256523;
    rd = rd - k * 6.0771005065061922e-11;
    r = static_cast<float>(rd);
    q = static_cast<int32_t>(k - 4.0 * __builtin_floor(k * 0.25));
}
MI_MATH float mi_sin_or_cos(float x, bool want_cos) {
    // NaN or inf in one compare (a || of two compares made GCC 12 give up vectorizing some
    // loops that hold an exp too)
    const bool finite = __builtin_fabsf(x) < __builtin_inff();
    float r; int32_t q;
    mi_reduce_pi2(finite ? x : 0.0f, r, q);
    float out = mi_sincos_poly(r, q, want_cos);
    return finite ? out : __builtin_nanf("");
}
MI_MATH float mi_sin(float x) { return mi_sin_or_cos(x, false); }
MI_MATH float mi_cos(float x) { return mi_sin_or_cos(x, true); }
// tan(r + q pi/2): sin(r) / cos(r), or -cos(r) / sin(r) for odd q; one reduction, one division
MI_MATH float mi_tan(float x) {
    const bool finite = __builtin_fabsf(x) < __builtin_inff();
    float r; int32_t q;
    mi_reduce_pi2(finite ? x : 0.0f, r, q);
    float s = mi_sincos_poly(r, 0, false), c = mi_sincos_poly(r, 0, true);
    float t = ((q & 1) ? -c : s) / ((q & 1) ? s : c);
    return finite ? t : __builtin_nanf("");
}
#endif
static inline double mi_tan(double x) { return __builtin_tan(x); }
static inline double mi_sin(double x) { return __builtin_sin(x); }
static inline double mi_cos(double x) { return __builtin_cos(x); }
