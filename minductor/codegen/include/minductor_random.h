// Random numbers computed where they are used (lowering/random.py): element `offset` of the
// stream keyed by `seed` is Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", 2011; JAX's default generator) of the counter (offset's low
// and high words) under the key (seed's), a pure function of the two. Any loop order, any
// thread, and every kernel that recomputes an element agree, and there is no state: a loop
// over it vectorizes (adds, xors and rotates of 32-bit lanes).
#pragma once

MI_MATH uint32_t mi_rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

MI_MATH void mi_threefry2x32(uint32_t k0, uint32_t k1, uint32_t& x0, uint32_t& x1) {
    const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
    const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
    x0 += ks[0];
    x1 += ks[1];
    #pragma GCC unroll 5
    for (int i = 0; i < 5; i++) {
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            x0 += x1;
            x1 = mi_rotl32(x1, rot[(i & 1) * 4 + j]);
            x1 ^= x0;
        }
        x0 += ks[(i + 1) % 3];
        x1 += ks[(i + 2) % 3] + static_cast<uint32_t>(i + 1);
    }
}

MI_MATH void mi_random_bits(int64_t seed, int64_t offset, uint32_t& x0, uint32_t& x1) {
    x0 = static_cast<uint32_t>(static_cast<uint64_t>(offset));
    x1 = static_cast<uint32_t>(static_cast<uint64_t>(offset) >> 32);
    mi_threefry2x32(static_cast<uint32_t>(static_cast<uint64_t>(seed)),
                    static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32), x0, x1);
}

// uniform in [0, 1): the top 24 bits of the first word (torch's float rand keeps 24 too)
MI_MATH float mi_rand(int64_t seed, int64_t offset) {
    uint32_t x0, x1;
    mi_random_bits(seed, offset, x0, x1);
    return static_cast<float>(static_cast<int32_t>(x0 >> 8)) * 5.9604644775390625e-08f;
}

// standard normal by Box-Muller from both words: sqrt(-2 log u) cos(2 pi v), u in (0, 1]
MI_MATH float mi_randn(int64_t seed, int64_t offset) {
    uint32_t x0, x1;
    mi_random_bits(seed, offset, x0, x1);
    float u = static_cast<float>(static_cast<int32_t>(x0 >> 8) + 1) * 5.9604644775390625e-08f;
    float v = static_cast<float>(static_cast<int32_t>(x1 >> 8)) * 5.9604644775390625e-08f;
    return mi_c_sqrt(-2.0f * mi_log(u)) * mi_cos(6.2831853071795865f * v);
}
