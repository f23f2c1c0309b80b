/* x86_avx2.h — private to the AVX2 files (x86_avx2.c and the per-format x86_avx2_*.c): the
 * helpers their dot products share, and the entry points of the formats kept in files of
 * their own, which x86_avx2.c's moek_avx2_ops table lists.
 *
 * Every file including this one is compiled with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt)
 * and runs only after isa.c's CPUID check chose moek_avx2_ops.
 */
#ifndef MOE_KERNELS_X86_AVX2_H
#define MOE_KERNELS_X86_AVX2_H

#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels_internal.h"

static inline float hsum(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

static inline float f16(uint16_t h)
{
	return _cvtsh_ss(h);
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Software prefetch distance of the decode dot products, in bytes of weights ahead of the one
 * being decoded. Decode streams each weight row once from DRAM; the hardware prefetcher alone
 * leaves a core that also decodes nibbles stalled on misses. Prefetches past
 * the end of a row run into the next row of the matrix, which the caller reads next; a
 * prefetch never faults.
 *
 * Rows whose activation row does not fit in half of L1d next to the weight stream (Mixtral's
 * down projection: 14336 columns, 28 KiB of Q8_0x2 or bf16 activations) reload it from L2
 * for every row, and those L1 misses queue behind the weight prefetches waiting on DRAM. For
 * them a second prefetch, into L2 and PREFETCH_FAR bytes ahead, brings the weights close
 * enough that the near one completes quickly. On narrower rows it costs bandwidth, so it is
 * only issued past WIDE_ACT_BYTES of activations (docs/performance.md, "Kernel design
 * measurements"). */
/* The VNNI forms' instructions on 256-bit registers (EVEX, AVX512VL), as inline assembly so
 * that the AVX2 files keep their AVX2 flags; executed only where isa.c found the CPU and OS
 * support them (MOEK_FORM_VNNI on), in functions compiled with VNNI_CODE.
 * dpbusd: acc + Σ u·s over each int32 lane's 4 bytes (u unsigned, s signed);
 * dpwssd: acc + the int16 pair products of a and b summed per int32 lane (madd + add). */
#define VNNI_CODE __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
ALWAYS_INLINE __m256i dpbusd(__m256i acc, __m256i u, __m256i s)
{
	__asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
	return acc;
}
ALWAYS_INLINE __m256i dpwssd(__m256i acc, __m256i a, __m256i b)
{
	__asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
	return acc;
}

#define PREFETCH_AHEAD 1536
#define PREFETCH_FAR 8192
#define WIDE_ACT_BYTES 16000 /* Q8_K of 14336 columns (16352) is past it, Q8_0 (15232) not */
ALWAYS_INLINE void prefetch_ahead(const void *p, bool far)
{
	_mm_prefetch((const char *)p + PREFETCH_AHEAD, _MM_HINT_T0);
	if (far)
		_mm_prefetch((const char *)p + PREFETCH_FAR, _MM_HINT_T1);
}

/* Whether a dot product whose activation row takes act_bytes needs the far prefetch. */
ALWAYS_INLINE bool wide_activation(size_t act_bytes)
{
	return act_bytes > WIDE_ACT_BYTES;
}

/* A dot entry point specialised on a constant token count (1..8), so that the per-token
 * accumulators of `body` live in registers. */
#define DOT_ENTRY(name, body, ...)                                                                 \
	static void name(const void *w, const float *sr, const void *act, size_t as, size_t nt,    \
	                 size_t k, float *out)                                                     \
	{                                                                                          \
		switch (nt) {                                                                      \
		case 1: body(w, sr, act, as, 1, k, out, __VA_ARGS__); break;                       \
		case 2: body(w, sr, act, as, 2, k, out, __VA_ARGS__); break;                       \
		case 3: body(w, sr, act, as, 3, k, out, __VA_ARGS__); break;                       \
		case 4: body(w, sr, act, as, 4, k, out, __VA_ARGS__); break;                       \
		case 5: body(w, sr, act, as, 5, k, out, __VA_ARGS__); break;                       \
		case 6: body(w, sr, act, as, 6, k, out, __VA_ARGS__); break;                       \
		case 7: body(w, sr, act, as, 7, k, out, __VA_ARGS__); break;                       \
		default: body(w, sr, act, as, 8, k, out, __VA_ARGS__); break;                      \
		}                                                                                  \
	}

/* A one-token, many-row entry point (moek_dot_rows_fn) around the same body with NT = 1: each
 * row gets the operations (and bits) of the single-row entry. */
#define ROWS_ENTRY(name, body, ...)                                                                \
	static void name(const void *w, size_t stride, size_t nr, const void *act, size_t k,       \
	                 float *out)                                                               \
	{                                                                                          \
		for (size_t r = 0; r < nr; r++)                                                    \
			body((const uint8_t *)w + r * stride, NULL, act, 0, 1, k, out + r,         \
			     __VA_ARGS__);                                                         \
	}

/* The same, compiled for the AVX-512 subset MOEK_FORM_VNNI needs (VNNI_CODE). */
#define VNNI_DOT_ENTRY(name, body, ...) VNNI_CODE DOT_ENTRY(name, body, __VA_ARGS__)
#define VNNI_ROWS_ENTRY(name, body, ...) VNNI_CODE ROWS_ENTRY(name, body, __VA_ARGS__)

/* An entry point that picks the form per call: `vnni` where isa.c found the CPU's VNNI forms
 * (MOEK_FORM_VNNI), else `avx2`; of moek_dot_fn's, moek_dot_rows_fn's and the group dots'
 * shapes. Put `static` before it for a file's own entry. */
#define VNNI_PICK_DOT(name, avx2, vnni)                                                            \
	void name(const void *w, const float *sr, const void *act, size_t as, size_t nt, size_t k, \
	          float *out)                                                                      \
	{                                                                                          \
		if (moek_isa_forms() & MOEK_FORM_VNNI)                                             \
			vnni(w, sr, act, as, nt, k, out);                                          \
		else                                                                               \
			avx2(w, sr, act, as, nt, k, out);                                          \
	}
#define VNNI_PICK_ROWS(name, avx2, vnni)                                                           \
	void name(const void *w, size_t stride, size_t nr, const void *act, size_t k, float *out)  \
	{                                                                                          \
		if (moek_isa_forms() & MOEK_FORM_VNNI)                                             \
			vnni(w, stride, nr, act, k, out);                                          \
		else                                                                               \
			avx2(w, stride, nr, act, k, out);                                          \
	}
#define VNNI_PICK_X8(name, avx2, vnni)                                                             \
	void name(const void *g, const void *act, size_t as, size_t nt, size_t k, float *out)      \
	{                                                                                          \
		if (moek_isa_forms() & MOEK_FORM_VNNI)                                             \
			vnni(g, act, as, nt, k, out);                                              \
		else                                                                               \
			avx2(g, act, as, nt, k, out);                                              \
	}

/* The group dots' software prefetch (moek_avx2_set_group_prefetch; x86_avx2.c says where it
 * pays), for one token [0] and for several [1]: every weight line `near` bytes ahead into L1
 * and `near + gap` bytes ahead into L2, a cursor per call so that each line is asked for once.
 * Shared with the wider ISAs' group dots, which follow the same setting. */
extern atomic_uint moek_avx2_x8_pf_near[2] __attribute__((visibility("hidden")));
extern atomic_uint moek_avx2_x8_pf_gap[2] __attribute__((visibility("hidden")));

struct x8_stream {
	uintptr_t next; /* the next line to prefetch; UINTPTR_MAX: none */
	size_t near, gap;
};

/* The cursor of a group dot over `nt` tokens starting at `group`. */
ALWAYS_INLINE struct x8_stream x8_stream_at(const void *group, int nt)
{
	const int several = nt > 1;
	const size_t near =
	    atomic_load_explicit(&moek_avx2_x8_pf_near[several], memory_order_relaxed);
	const size_t gap =
	    atomic_load_explicit(&moek_avx2_x8_pf_gap[several], memory_order_relaxed);
	const uintptr_t first = ((uintptr_t)group + near) & ~(uintptr_t)63;
	return (struct x8_stream){near ? first : UINTPTR_MAX, near, gap};
}

/* The lines up to `near` bytes past `end` (the end of what the dot reads next). */
ALWAYS_INLINE void x8_prefetch(struct x8_stream *s, const void *end)
{
	for (; s->next < (uintptr_t)end + s->near; s->next += 64) {
		_mm_prefetch((const char *)s->next, _MM_HINT_T0);
		if (s->gap)
			_mm_prefetch((const char *)s->next + s->gap, _MM_HINT_T1);
	}
}

/* 32 signed bytes in a register as floats times d, widened by lane extracts and byte shifts
 * (one rounding each, as the references): measured faster than the stack round trip for
 * MXFP4, whose bytes come from a vpshufb. */
ALWAYS_INLINE void store_i8x32_lanes(__m256i q, __m256 d, float *dst)
{
	const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
	const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
	for (int p = 0; p < 4; p++)
		_mm256_storeu_ps(
		    dst + 8 * p,
		    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p]))));
}

/* An entry point without row scales (the interleaved groups', the IQ4 row dots') per format
 * and form, specialised on the token count. */
#define X8_ENTRY(name, body, vnni, attr)                                                           \
	attr static void name(const void *g, const void *act, size_t as, size_t nt, size_t k,      \
	                      float *out)                                                          \
	{                                                                                          \
		switch (nt) {                                                                      \
		case 1: body(g, act, as, 1, k, out, vnni); break;                                  \
		case 2: body(g, act, as, 2, k, out, vnni); break;                                  \
		case 3: body(g, act, as, 3, k, out, vnni); break;                                  \
		case 4: body(g, act, as, 4, k, out, vnni); break;                                  \
		case 5: body(g, act, as, 5, k, out, vnni); break;                                  \
		case 6: body(g, act, as, 6, k, out, vnni); break;                                  \
		case 7: body(g, act, as, 7, k, out, vnni); break;                                  \
		default: body(g, act, as, 8, k, out, vnni); break;                                 \
		}                                                                                  \
	}
static inline const struct block_q8_K *q8k_token(const void *act, size_t as, int t, size_t i)
{
	return (const struct block_q8_K *)((const uint8_t *)act + (size_t)t * as) + i;
}

/* ---- Formats in files of their own ------------------------------------------------------- */

/* Q2_K and Q3_K against Q8_K activations (x86_avx2_k23.c): moek_dot_fn, moek_dot_rows_fn, and
 * dequantization for prefill tiles, bit-identical to the reference (k a multiple of 256). */
void moek_avx2_dot_q2_K(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                        size_t k, float *out);
void moek_avx2_dot_q3_K(const void *w, const float *sr, const void *act, size_t as, size_t nt,
                        size_t k, float *out);
void moek_avx2_rows_q2_K(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                         float *out);
void moek_avx2_rows_q3_K(const void *w, size_t stride, size_t nr, const void *act, size_t k,
                         float *out);
void moek_avx2_dequantize_q2_K(const void *w, float *dst, size_t k);
void moek_avx2_dequantize_q3_K(const void *w, float *dst, size_t k);

#endif /* MOE_KERNELS_X86_AVX2_H */
