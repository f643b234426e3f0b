// minductor C++ kernel prelude: scalar helpers with PyTorch semantics. No torch headers,
// so a kernel compiles in a fraction of a second.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>

#define MI_MAX_THREADS 256

typedef _Float16 mi_half;
typedef uint16_t mi_bf16;

static inline float mi_bf16_to_float(mi_bf16 v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
}

static inline mi_bf16 mi_float_to_bf16(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    if (std::isnan(v)) return static_cast<mi_bf16>(0x7fc0);
    uint32_t rounding = 0x7fff + ((bits >> 16) & 1);  // round to nearest even
    return static_cast<mi_bf16>((bits + rounding) >> 16);
}

static inline float mi_round_bf16(float v) { return mi_bf16_to_float(mi_float_to_bf16(v)); }
static inline float mi_round_half(float v) { return static_cast<float>(static_cast<mi_half>(v)); }

// NaN-propagating maximum/minimum (torch.maximum semantics)
template <typename T> static inline T mi_maximum(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if (a != a) return a;
        if (b != b) return b;
    }
    return a > b ? a : b;
}
template <typename T> static inline T mi_minimum(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if (a != a) return a;
        if (b != b) return b;
    }
    return a < b ? a : b;
}

// Python-style floor division and modulo
template <typename T> static inline T mi_floordiv(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        if (b == 0) return a / b;
        T mod = std::fmod(a, b);
        T div = (a - mod) / b;
        if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
        if (div == 0) return std::copysign(T(0), a / b);
        T floordiv = std::floor(div);
        if (div - floordiv > T(0.5)) floordiv += 1;
        return floordiv;
    } else {
        if (b == 0) return 0;
        T q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
        return q;
    }
}
template <typename T> static inline T mi_truncdiv(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        return std::trunc(a / b);
    } else {
        return b == 0 ? 0 : a / b;
    }
}
template <typename T> static inline T mi_mod(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        T m = std::fmod(a, b);
        if (m != 0 && ((b < 0) != (m < 0))) m += b;
        return m;
    } else {
        if (b == 0) return 0;
        T m = a % b;
        if (m != 0 && ((b < 0) != (m < 0))) m += b;
        return m;
    }
}
template <typename T> static inline T mi_fmod(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return std::fmod(a, b);
    else return b == 0 ? 0 : a % b;
}
template <typename T> static inline T mi_pow(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
        return std::pow(a, b);
    } else {
        if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b % 2) ? -1 : 1) : 0);
        T result = 1;
        while (b) { if (b & 1) result *= a; a *= a; b >>= 1; }
        return result;
    }
}
template <typename T> static inline T mi_sign(T a) {
    if constexpr (std::is_floating_point_v<T>) {
        if (a != a) return a;
    }
    return static_cast<T>((T(0) < a) - (a < T(0)));
}
template <typename T> static inline T mi_sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <typename T> static inline T mi_relu(T a) {
    if constexpr (std::is_floating_point_v<T>) { if (a != a) return a; }
    return a > T(0) ? a : T(0);
}
template <typename T> static inline T mi_abs(T a) {
    if constexpr (std::is_same_v<T, bool>) return a;
    else if constexpr (std::is_floating_point_v<T>) return std::fabs(a);
    else return a < 0 ? -a : a;
}
template <typename T> static inline T mi_rsqrt(T a) { return T(1) / std::sqrt(a); }
template <typename T> static inline T mi_reciprocal(T a) { return T(1) / a; }
template <typename T> static inline auto mi_shl(T a, T b) {
    return (b < 0 || b >= T(sizeof(T) * 8)) ? T(0) : static_cast<T>(a << b);
}
template <typename T> static inline auto mi_shr(T a, T b) {
    if (b < 0 || b >= T(sizeof(T) * 8)) return static_cast<T>(a < 0 ? -1 : 0);
    return static_cast<T>(a >> b);
}
template <typename T> static inline T mi_erfinv(T y) {
    // Giles' approximation refined by two Newton steps on erf
    double x, w = -std::log((1.0 - y) * (1.0 + y));
    if (y <= -1) return -std::numeric_limits<T>::infinity();
    if (y >= 1) return std::numeric_limits<T>::infinity();
    if (w < 5.0) {
        w -= 2.5;
        x = 2.81022636e-08; x = 3.43273939e-07 + x * w; x = -3.5233877e-06 + x * w;
        x = -4.39150654e-06 + x * w; x = 0.00021858087 + x * w; x = -0.00125372503 + x * w;
        x = -0.00417768164 + x * w; x = 0.246640727 + x * w; x = 1.50140941 + x * w;
    } else {
        w = std::sqrt(w) - 3.0;
        x = -0.000200214257; x = 0.000100950558 + x * w; x = 0.00134934322 + x * w;
        x = -0.00367342844 + x * w; x = 0.00573950773 + x * w; x = -0.0076224613 + x * w;
        x = 0.00943887047 + x * w; x = 1.00167406 + x * w; x = 2.83297682 + x * w;
    }
    x *= y;
    for (int i = 0; i < 2; i++) {
        double err = std::erf(x) - y;
        x -= err / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
    }
    return static_cast<T>(x);
}

// Reduction accumulators -------------------------------------------------------------

template <typename T> static inline T mi_lowest() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
}
template <typename T> static inline T mi_highest() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
}

template <typename T> struct MiArg {
    T value;
    int64_t index;
};
template <typename T> static inline bool mi_isnan(T v) {
    if constexpr (std::is_floating_point_v<T>) return v != v;
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
