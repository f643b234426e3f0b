// Window gathers: the reads of an innermost loop through a table of indices (cpp_windows.py),
// done as a load of a window of contiguous elements and a permutation of its lanes, where a
// vector's worth of indices falls within one or two vectors of elements. An upsample, a pad or
// a roll reads its rows so; a gather instruction fetches lane by lane (a nearest 2x upsample's
// kernel at (8, 64, 128, 128): 8.1 ms with vgatherdps, 2.8 ms with a load and a vpermps).
// GCC's vector extensions, so no intrinsics headers: __builtin_shuffle with a variable mask is
// one vpermps / vpermt2ps (vpermw, vpermpd) on AVX-512, vpermps on AVX2.
#pragma once

#if defined(__AVX512F__)
#define MI_WINDOW_BYTES 64
#elif defined(__AVX2__)
#define MI_WINDOW_BYTES 32
#else
#define MI_WINDOW_BYTES 16
#endif

template <int Size> struct mi_lane_s;
template <> struct mi_lane_s<2> { using type = uint16_t; using index = int16_t; };
template <> struct mi_lane_s<4> { using type = uint32_t; using index = int32_t; };
template <> struct mi_lane_s<8> { using type = uint64_t; using index = int64_t; };

// The plan of a table of ``n`` indices for elements of ``Size`` bytes, per block of lanes (the
// tail past the last whole block is read lane by lane): 2 s + 0 where the block's indices fall
// in the one-vector window starting at element s, 2 s + 1 for a two-vector window, -1 where
// they spread wider (that block is read lane by lane). A window starts no lower than the
// table's lowest index and ends no higher than its highest, so it reads only elements between
// two the loop reads anyway: within the tensor, whatever the row.
template <int Size> static inline void mi_window_plan(const int32_t* table, int64_t n, int32_t* plan) {
    constexpr int32_t lanes = MI_WINDOW_BYTES / Size;
    int32_t lo = table[0], hi = table[0];
    for (int64_t i = 1; i < n; i++) {
        lo = table[i] < lo ? table[i] : lo;
        hi = table[i] > hi ? table[i] : hi;
    }
    for (int64_t b = 0; b + lanes <= n; b += lanes) {
        int32_t block_lo = table[b], block_hi = table[b];
        for (int64_t i = b + 1; i < b + lanes; i++) {
            block_lo = table[i] < block_lo ? table[i] : block_lo;
            block_hi = table[i] > block_hi ? table[i] : block_hi;
        }
        int32_t step = -1;
        for (int32_t vectors = 1; vectors <= 2 && step < 0; vectors++) {
            const int32_t span = vectors * lanes;
            const int32_t start = block_lo < hi - span + 1 ? block_lo : hi - span + 1;
            if (block_hi - block_lo < span && hi - lo >= span - 1 && start >= 0)
                step = 2 * start + (vectors - 1);
        }
        plan[b / lanes] = step;
    }
}

// out[i] = row[table[i]] for i < n, by the plan mi_window_plan<sizeof(T)> made of the table.
template <typename T>
static inline void mi_window_gather(const T* row, const int32_t* table, const int32_t* plan, int64_t n, T* out) {
    using Lane = typename mi_lane_s<sizeof(T)>::type;
    using Index = typename mi_lane_s<sizeof(T)>::index;
    constexpr int lanes = MI_WINDOW_BYTES / sizeof(T);
    typedef Lane Vec __attribute__((vector_size(MI_WINDOW_BYTES)));
    typedef Index IndexVec __attribute__((vector_size(MI_WINDOW_BYTES)));
    typedef int32_t TableVec __attribute__((vector_size(lanes * 4)));
    int64_t b = 0;
    for (; b + lanes <= n; b += lanes) {
        const int32_t step = plan[b / lanes];
        if (step < 0) {
            for (int64_t i = b; i < b + lanes; i++) out[i] = row[table[i]];
            continue;
        }
        const int32_t start = step >> 1;
        TableVec at;
        __builtin_memcpy(&at, table + b, sizeof(at));
        const IndexVec lane = __builtin_convertvector(at - start, IndexVec);
        Vec first, result;
        __builtin_memcpy(&first, row + start, sizeof(first));
        if (step & 1) {
            Vec second;
            __builtin_memcpy(&second, row + start + lanes, sizeof(second));
            result = __builtin_shuffle(first, second, lane);
        } else {
            result = __builtin_shuffle(first, lane);
        }
        __builtin_memcpy(out + b, &result, sizeof(result));
    }
    for (; b < n; b++) out[b] = row[table[b]];
}

// Windows of one row tensor through one table, kept by a thread across a loop nest's
// iterations: `pool` holds K buffers of `stride` values (at[b]: the row offset buffer b holds,
// mi_lowest when none). Points got[w] at a buffer holding the window at offset want[w], reading
// only those no buffer holds into buffers no other window of this call takes: a bilinear
// upsample's two rows, one of which the next output rows read again.
template <typename T, int K>
static inline void mi_window_fetch(const T* src, const int32_t* table, const int32_t* plan, int64_t n, int64_t stride,
                                   T* pool, int64_t* at, const int64_t* want, const T** got) {
    bool taken[K] = {};
    bool found[K] = {};
    for (int w = 0; w < K; w++)
        for (int b = 0; b < K; b++)
            if (at[b] == want[w]) { taken[b] = found[w] = true; got[w] = pool + b * stride; break; }
    for (int w = 0; w < K; w++) {
        if (found[w]) continue;
        int b = 0;
        while (taken[b]) b++;
        mi_window_gather(src + want[w], table, plan, n, pool + b * stride);
        at[b] = want[w];
        taken[b] = true;
        got[w] = pool + b * stride;
        for (int v = w + 1; v < K; v++)  // (two windows of one offset share the buffer)
            if (!found[v] && want[v] == want[w]) { found[v] = true; got[v] = got[w]; }
    }
}
