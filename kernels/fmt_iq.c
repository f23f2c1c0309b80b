/* fmt_iq.c — reference codecs of ggml's lattice i-quants IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ3_S,
 * IQ2_S and IQ1_M (ggml types 16, 17, 18, 19, 21, 22, 29; layouts in kernels_internal.h, codebooks
 * in iq_grids.c). The IQ1 quantizers are their own (see their section).
 *
 * Decoding is ggml's formula, in ggml's order of float operations: the group scale
 * db = d · (0.5 + s) · k (k = 0.25 for IQ2, 0.5 for IQ3_XXS; IQ3_S: d · (1 + 2s)), then
 * db · grid byte, then the sign.
 *
 * The quantizers are this project's own and simpler than llama.cpp's importance-weighted
 * search (quality is lower; the blocks are valid and decode the same in any reader). Per group
 * of 8 weights the signs are stored as they are, except that an odd count of minus signs
 * (which the sign table of all but IQ3_S cannot hold) gives up the sign of the group's
 * smallest magnitude. The
 * magnitudes go to the grid entry nearest in squared error at the group's scale: with the
 * dot products a·g of the group with every entry computed once, a scale S picks
 * argmin S²|g|² − 2S a·g (the first entry on a tie; IQ3_XXS picks its two 4-weight entries
 * per group apart). Each scale unit (32 weights for IQ2_XXS and IQ3_XXS, 16 for IQ2_XS) tries
 * six scales from its largest magnitude (which each maps onto the grid's largest magnitude,
 * 43 or 62, times 0.6 … 1.1), refits each by least squares over the entries it picked, and keeps
 * the fit with the lowest error. The super-block scale d maps the largest unit scale onto the 4-bit
 * code 15; each unit's code is the best of the nearest for d as stored (f16) and its two
 * neighbours, and its groups' entries are picked again for the scale the code gives. Non-finite
 * magnitudes count as 0 (NaN) or the largest float (±inf), and d is clamped to the largest f16, so
 * no value of the input reaches undefined behaviour or a non-finite weight.
 *
 * Pure functions; no allocation (the decoded grid and a block's dot products live on the
 * stack, 180 KiB); thread-safe.
 */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "kernels_internal.h"

enum { IQ_GROUP = 8, IQ_GROUPS = QK_K / IQ_GROUP, IQ_MAX_GRID = 1024 };

static inline float f16(uint16_t h)
{
	return moek_f16_to_f32(h);
}

static inline uint8_t grid_byte(uint64_t entry, int j)
{
	return (uint8_t)(entry >> (8 * j));
}

/* ---- Dequantization ----------------------------------------------------------------------- */

/* 8 weights of one grid entry and sign pattern at scale db, as ggml computes them. */
static inline void put_group(float *y, float db, uint64_t entry, uint8_t signs)
{
	for (int j = 0; j < IQ_GROUP; j++)
		y[j] = db * (float)grid_byte(entry, j) * (signs >> j & 1 ? -1.0f : 1.0f);
}

static inline uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void moek_dequantize_iq2_xxs(const void *src, float *y, size_t n)
{
	const struct block_iq2_xxs *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		const uint8_t *q = (const uint8_t *)b[i].qs;
		for (int ib = 0; ib < QK_K / 32; ib++, q += 8) {
			const uint32_t signs = le32(q + 4);
			const float db = d * (0.5f + (float)(signs >> 28)) * 0.25f;
			for (int l = 0; l < 4; l++, y += IQ_GROUP)
				put_group(y, db, moek_iq2xxs_grid[q[l]],
				          moek_ksigns_iq2xs[(signs >> (7 * l)) & 127]);
		}
	}
}

void moek_dequantize_iq3_xxs(const void *src, float *y, size_t n)
{
	const struct block_iq3_xxs *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		const uint8_t *q = b[i].qs;
		for (int ib = 0; ib < QK_K / 32; ib++, q += 8) {
			const uint32_t aux = le32(b[i].qs + QK_K / 4 + 4 * ib);
			const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
			for (int l = 0; l < 4; l++, y += IQ_GROUP) {
				const uint64_t lo = moek_iq3xxs_grid[q[2 * l]];
				const uint64_t hi = moek_iq3xxs_grid[q[2 * l + 1]];
				put_group(y, db, lo | hi << 32,
				          moek_ksigns_iq2xs[(aux >> (7 * l)) & 127]);
			}
		}
	}
}

void moek_dequantize_iq3_s(const void *src, float *y, size_t n)
{
	const struct block_iq3_s *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const float db =
			    d * (float)(1 + 2 * ((b[i].scales[ib / 2] >> (4 * (ib % 2))) & 15));
			const uint8_t *q = b[i].qs + 8 * ib;
			const unsigned qh = b[i].qh[ib];
			for (int l = 0; l < 4; l++, y += IQ_GROUP) {
				const uint64_t lo =
				    moek_iq3s_grid[q[2 * l] | ((qh >> (2 * l)) & 1) << 8];
				const uint64_t hi =
				    moek_iq3s_grid[q[2 * l + 1] | ((qh >> (2 * l + 1)) & 1) << 8];
				put_group(y, db, lo | hi << 32, b[i].signs[4 * ib + l]);
			}
		}
	}
}

void moek_dequantize_iq1_s(const void *src, float *y, size_t n)
{
	const struct block_iq1_s *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const unsigned qh = b[i].qh[ib];
			const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
			const float delta = qh & 0x8000 ? -MOEK_IQ1S_DELTA : MOEK_IQ1S_DELTA;
			for (int l = 0; l < 4; l++, y += IQ_GROUP) {
				const uint64_t e = moek_iq1s_grid[b[i].qs[4 * ib + l] |
				                                  ((qh >> (3 * l)) & 7) << 8];
				for (int j = 0; j < IQ_GROUP; j++)
					y[j] = dl * ((float)(int8_t)grid_byte(e, j) + delta);
			}
		}
	}
}

/* IQ1_M's f16 d from the top nibbles of its 4 scale words, and the 3-bit scale of weights
 * 16h … 16h + 15. */
static inline uint16_t iq1m_d(const struct block_iq1_m *b)
{
	uint16_t sc[4];
	memcpy(sc, b->scales, sizeof(sc));
	return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
	                  (sc[3] & 0xf000));
}

static inline int iq1m_scale(const struct block_iq1_m *b, int h)
{
	const unsigned w = (unsigned)b->scales[2 * (h / 4)] | (unsigned)b->scales[2 * (h / 4) + 1]
	                                                          << 8;
	return (int)((w >> (3 * (h % 4))) & 7);
}

/* Group g's grid index and whether its delta is negative. */
static inline int iq1m_index(const struct block_iq1_m *b, int g, bool *neg)
{
	const unsigned qh = b->qh[g / 2] >> (4 * (g % 2));
	*neg = qh & 8;
	return (int)(b->qs[g] | (qh & 7) << 8);
}

void moek_dequantize_iq1_m(const void *src, float *y, size_t n)
{
	const struct block_iq1_m *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(iq1m_d(&b[i]));
		for (int g = 0; g < IQ_GROUPS; g++, y += IQ_GROUP) {
			const float dl = d * (float)(2 * iq1m_scale(&b[i], g / 2) + 1);
			bool neg;
			const uint64_t e = moek_iq1s_grid[iq1m_index(&b[i], g, &neg)];
			const float delta = neg ? -MOEK_IQ1S_DELTA : MOEK_IQ1S_DELTA;
			for (int j = 0; j < IQ_GROUP; j++)
				y[j] = dl * ((float)(int8_t)grid_byte(e, j) + delta);
		}
	}
}

void moek_dequantize_iq2_s(const void *src, float *y, size_t n)
{
	const struct block_iq2_s *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const float db[2] = {d * (0.5f + (float)(b[i].scales[ib] & 15)) * 0.25f,
			                     d * (0.5f + (float)(b[i].scales[ib] >> 4)) * 0.25f};
			for (int l = 0; l < 4; l++, y += IQ_GROUP) {
				const int idx = b[i].qs[4 * ib + l] | ((b[i].qh[ib] >> (2 * l)) & 3)
				                                          << 8;
				put_group(y, db[l / 2], moek_iq2s_grid[idx],
				          b[i].qs[32 + 4 * ib + l]);
			}
		}
	}
}

void moek_dequantize_iq2_xs(const void *src, float *y, size_t n)
{
	const struct block_iq2_xs *b = src;
	for (size_t i = 0; i < n / QK_K; i++) {
		const float d = f16(b[i].d);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			const float db[2] = {d * (0.5f + (float)(b[i].scales[ib] & 15)) * 0.25f,
			                     d * (0.5f + (float)(b[i].scales[ib] >> 4)) * 0.25f};
			for (int l = 0; l < 4; l++, y += IQ_GROUP) {
				const uint16_t c = b[i].qs[4 * ib + l];
				put_group(y, db[l / 2], moek_iq2xs_grid[c & 511],
				          moek_ksigns_iq2xs[c >> 9]);
			}
		}
	}
}

/* ---- Scalar reference dots against Q8_K --------------------------------------------------- */

/* Σ grid · sign · q over one group (exact). */
static inline int32_t group_dot(uint64_t entry, uint8_t signs, const int8_t *q)
{
	int32_t s = 0;
	for (int j = 0; j < IQ_GROUP; j++) {
		const int32_t v = (int32_t)grid_byte(entry, j) * q[j];
		s += signs >> j & 1 ? -v : v;
	}
	return s;
}

float moek_iq_dot_q8k_ref(uint32_t format, const void *w, const void *act, size_t k)
{
	const struct block_q8_K *y = act;
	float acc = 0.0f;
	for (size_t i = 0; i < k / QK_K; i++) {
		int32_t sumi = 0;
		uint16_t d16;
		const int8_t *q = y[i].qs;
		if (format == MOEK_IQ2_XXS) {
			const struct block_iq2_xxs *x = (const struct block_iq2_xxs *)w + i;
			const uint8_t *c = (const uint8_t *)x->qs;
			d16 = x->d;
			for (int ib = 0; ib < QK_K / 32; ib++, c += 8) {
				const uint32_t signs = le32(c + 4);
				int32_t sub = 0;
				for (int l = 0; l < 4; l++, q += IQ_GROUP)
					sub += group_dot(
					    moek_iq2xxs_grid[c[l]],
					    moek_ksigns_iq2xs[(signs >> (7 * l)) & 127], q);
				sumi += (int32_t)(2 * (signs >> 28) + 1) * sub;
			}
		} else if (format == MOEK_IQ3_XXS) {
			const struct block_iq3_xxs *x = (const struct block_iq3_xxs *)w + i;
			const uint8_t *c = x->qs;
			d16 = x->d;
			for (int ib = 0; ib < QK_K / 32; ib++, c += 8) {
				const uint32_t aux = le32(x->qs + QK_K / 4 + 4 * ib);
				int32_t sub = 0;
				for (int l = 0; l < 4; l++, q += IQ_GROUP)
					sub += group_dot(
					    moek_iq3xxs_grid[c[2 * l]] |
					        (uint64_t)moek_iq3xxs_grid[c[2 * l + 1]] << 32,
					    moek_ksigns_iq2xs[(aux >> (7 * l)) & 127], q);
				sumi += (int32_t)(2 * (aux >> 28) + 1) * sub;
			}
			/* d · (0.5 + s) · 0.5 = d · (2s + 1) · 0.25: twice the IQ2 factor */
			acc = fmaf(f16(d16) * y[i].d * 0.25f, (float)sumi, acc);
			continue;
		} else if (format == MOEK_IQ1_S) {
			/* 8 · (grid + delta) = 8 · grid ± 1: the block's sum is exact in integers
			 */
			const struct block_iq1_s *x = (const struct block_iq1_s *)w + i;
			d16 = x->d;
			for (int ib = 0; ib < QK_K / 32; ib++) {
				const unsigned qh = x->qh[ib];
				int32_t sub = 0, qsum = 0;
				for (int l = 0; l < 4; l++, q += IQ_GROUP) {
					const uint64_t e =
					    moek_iq1s_grid[x->qs[4 * ib + l] | ((qh >> (3 * l)) & 7)
					                                           << 8];
					for (int j = 0; j < IQ_GROUP; j++) {
						sub += (int8_t)grid_byte(e, j) * q[j];
						qsum += q[j];
					}
				}
				const int32_t ls = (int32_t)(2 * ((qh >> 12) & 7) + 1);
				sumi += ls * (8 * sub + (qh & 0x8000 ? -qsum : qsum));
			}
		} else if (format == MOEK_IQ2_S) {
			const struct block_iq2_s *x = (const struct block_iq2_s *)w + i;
			d16 = x->d;
			for (int g = 0; g < IQ_GROUPS; g++, q += IQ_GROUP) {
				const int ib = g / 4, l = g % 4;
				const int idx = x->qs[g] | ((x->qh[ib] >> (2 * l)) & 3) << 8;
				const int s = (x->scales[ib] >> (4 * (l / 2))) & 15;
				sumi +=
				    (2 * s + 1) * group_dot(moek_iq2s_grid[idx], x->qs[32 + g], q);
			}
		} else if (format == MOEK_IQ1_M) {
			const struct block_iq1_m *x = (const struct block_iq1_m *)w + i;
			d16 = iq1m_d(x);
			for (int g = 0; g < IQ_GROUPS; g++, q += IQ_GROUP) {
				bool neg;
				const uint64_t e = moek_iq1s_grid[iq1m_index(x, g, &neg)];
				int32_t sub = 0;
				for (int j = 0; j < IQ_GROUP; j++)
					sub +=
					    (8 * (int8_t)grid_byte(e, j) + (neg ? -1 : 1)) * q[j];
				sumi += (2 * iq1m_scale(x, g / 2) + 1) * sub;
			}
		} else if (format == MOEK_IQ3_S) {
			const struct block_iq3_s *x = (const struct block_iq3_s *)w + i;
			d16 = x->d;
			for (int ib = 0; ib < QK_K / 32; ib++) {
				const uint8_t *c = x->qs + 8 * ib;
				const unsigned qh = x->qh[ib];
				int32_t sub = 0;
				for (int l = 0; l < 4; l++, q += IQ_GROUP)
					sub += group_dot(
					    moek_iq3s_grid[c[2 * l] | ((qh >> (2 * l)) & 1) << 8] |
					        (uint64_t)moek_iq3s_grid[c[2 * l + 1] |
					                                 ((qh >> (2 * l + 1)) & 1)
					                                     << 8]
					            << 32,
					    x->signs[4 * ib + l], q);
				sumi +=
				    (1 + 2 * ((x->scales[ib / 2] >> (4 * (ib % 2))) & 15)) * sub;
			}
			acc = fmaf(f16(d16) * y[i].d, (float)sumi, acc);
			continue;
		} else {
			const struct block_iq2_xs *x = (const struct block_iq2_xs *)w + i;
			d16 = x->d;
			for (int g = 0; g < IQ_GROUPS; g++, q += IQ_GROUP) {
				const uint16_t c = x->qs[g];
				const int s = (x->scales[g / 4] >> (4 * ((g / 2) % 2))) & 15;
				sumi += (2 * s + 1) * group_dot(moek_iq2xs_grid[c & 511],
				                                moek_ksigns_iq2xs[c >> 9], q);
			}
		}
		acc = fmaf(f16(d16) * y[i].d * 0.125f, (float)sumi, acc);
	}
	return acc;
}

/* ---- Quantization ------------------------------------------------------------------------- */

/* A codebook decoded to floats: n entries of w (8 or 4) magnitudes. */
struct iq_grid {
	int n, w;
	float vmax; /* the largest magnitude of any entry */
	float v[IQ_MAX_GRID][IQ_GROUP];
	float norm[IQ_MAX_GRID]; /* Σ v² */
};

static void grid_decode(const void *grid, int n, int w, struct iq_grid *g)
{
	g->n = n, g->w = w, g->vmax = 0.0f;
	for (int e = 0; e < n; e++) {
		const uint64_t entry =
		    w == 8 ? ((const uint64_t *)grid)[e] : ((const uint32_t *)grid)[e];
		float s = 0.0f;
		for (int j = 0; j < w; j++) {
			g->v[e][j] = (float)grid_byte(entry, j);
			s += g->v[e][j] * g->v[e][j];
			g->vmax = g->v[e][j] > g->vmax ? g->v[e][j] : g->vmax;
		}
		g->norm[e] = s;
	}
}

/* One super-block: its magnitudes (sanitised), the sign pattern of each group of 8 (an even
 * count of minus signs), and the dot product of each part (w weights: one grid entry) with
 * every entry. */
struct iq_block {
	float a[QK_K];
	uint8_t signs[IQ_GROUPS];
	float dot[QK_K / 4 * 512]; /* 64 parts x 512 entries, or 32 x 1024 (IQ2_S) */
};

static inline const float *part_dots(const struct iq_grid *g, const struct iq_block *b, int p)
{
	return b->dot + (size_t)p * (size_t)g->n;
}

static void block_prepare(const float *x, const struct iq_grid *g, bool even, struct iq_block *b)
{
	for (int k = 0; k < IQ_GROUPS; k++) {
		unsigned m = 0;
		int smallest = 0;
		float *a = b->a + IQ_GROUP * k;
		for (int j = 0; j < IQ_GROUP; j++) {
			const float v = x[IQ_GROUP * k + j];
			const float av = fabsf(v);
			a[j] = av != av ? 0.0f : av > FLT_MAX ? FLT_MAX : av; /* NaN, inf */
			m |= (unsigned)(v < 0.0f) << j;
			if (a[j] < a[smallest])
				smallest = j;
		}
		if (even && (__builtin_popcount(m) & 1))
			m ^= 1u << smallest;
		b->signs[k] = (uint8_t)m;
	}
	for (int p = 0; p < QK_K / g->w; p++) {
		float *dot = b->dot + (size_t)p * (size_t)g->n;
		const float *a = b->a + g->w * p;
		for (int e = 0; e < g->n; e++) {
			float s = 0.0f;
			for (int j = 0; j < g->w; j++)
				s += g->v[e][j] * a[j];
			dot[e] = s;
		}
	}
}

/* The entry nearest part p at scale s: argmin s²|g|² − 2s a·g, the first on a tie. */
static int part_pick(const struct iq_grid *g, const struct iq_block *b, int p, float s)
{
	const float *dot = part_dots(g, b, p);
	int best = 0;
	float best_cost = s * s * g->norm[0] - 2.0f * s * dot[0];
	for (int e = 1; e < g->n; e++) {
		const float cost = s * s * g->norm[e] - 2.0f * s * dot[e];
		if (cost < best_cost) {
			best_cost = cost;
			best = e;
		}
	}
	return best;
}

/* The least-squares scale of parts [p0, p0 + np) (0 when they are all zero). */
static float unit_scale(const struct iq_grid *g, const struct iq_block *b, int p0, int np)
{
	static const float tries[] = {0.6f, 0.7f, 0.8f, 0.9f, 1.0f, 1.1f};
	float amax = 0.0f;
	for (int i = g->w * p0; i < g->w * (p0 + np); i++)
		amax = b->a[i] > amax ? b->a[i] : amax;
	if (!(amax > 1e-30f))
		return 0.0f;
	float best = 0.0f, best_gain = -1.0f;
	for (size_t t = 0; t < sizeof(tries) / sizeof(tries[0]); t++) {
		const float s = amax / g->vmax * tries[t];
		float sga = 0.0f, sgg = 0.0f;
		for (int p = p0; p < p0 + np; p++) {
			const int e = part_pick(g, b, p, s);
			sga += part_dots(g, b, p)[e];
			sgg += g->norm[e];
		}
		/* the squared error is Σa² − (Σ a·g)² / Σ g²: the largest gain wins */
		const float gain = sga / sgg * sga;
		if (sgg > 0.0f && gain > best_gain) {
			best_gain = gain;
			best = sga / sgg;
		}
	}
	return best;
}

/* The scale code c (0..15) means dd · (0.5 + c) · k. Of the code nearest the unit scale s and
 * its two neighbours, the one whose scale, with the entries it picks for the unit's parts,
 * gives the lowest squared error (the nearest on a tie). */
static int unit_code(const struct iq_grid *g, const struct iq_block *b, int p0, int np, float s,
                     float dd, float k)
{
	if (!(dd > 0.0f))
		return 0;
	const float v = s / (dd * k) - 0.5f;
	const int c0 = !(v > 0.0f) ? 0 : v >= 15.0f ? 15 : (int)lrintf(v);
	static const int order[3] = {0, -1, 1};
	int best = c0;
	float best_cost = 0.0f;
	for (int o = 0; o < 3; o++) {
		const int c = c0 + order[o];
		if (c < 0 || c > 15)
			continue;
		const float db = dd * (0.5f + (float)c) * k;
		float cost = 0.0f;
		for (int p = p0; p < p0 + np; p++) {
			const int e = part_pick(g, b, p, db);
			cost += db * db * g->norm[e] - 2.0f * db * part_dots(g, b, p)[e];
		}
		if (o == 0 || cost < best_cost) {
			best_cost = cost;
			best = c;
		}
	}
	return best;
}

/* The super-block scale that puts the largest unit scale on code 15, as stored (f16, clamped
 * to the largest finite f16). */
static uint16_t super_scale(const float *units, int nu, float k)
{
	float m = 0.0f;
	for (int u = 0; u < nu; u++)
		m = units[u] > m ? units[u] : m;
	float d = m / (15.5f * k);
	d = d > 65504.0f ? 65504.0f : d;
	return moek_f32_to_f16(d);
}

/* A format's quantization: its codebook, parts per scale unit, the scale step k, and how a
 * block stores a unit's code and its parts' entries (with the groups' signs). */
struct iq_scheme {
	int grid_n, grid_w, unit_parts;
	float k;
	bool even_signs; /* the sign table holds only an even count of minus signs */
	void (*store)(void *blk, const struct iq_block *b, int u, int code, const int *entries);
};

static void store_iq2_xxs(void *blk, const struct iq_block *b, int u, int code, const int *e)
{
	uint8_t *c = (uint8_t *)((struct block_iq2_xxs *)blk)->qs + 8 * u;
	uint32_t signs = (uint32_t)code << 28;
	for (int l = 0; l < 4; l++) {
		c[l] = (uint8_t)e[l];
		signs |= (uint32_t)(b->signs[4 * u + l] & 127) << (7 * l);
	}
	for (int i = 0; i < 4; i++)
		c[4 + i] = (uint8_t)(signs >> (8 * i));
}

static void store_iq2_xs(void *blk, const struct iq_block *b, int u, int code, const int *e)
{
	struct block_iq2_xs *y = blk;
	y->scales[u / 2] = (uint8_t)(u % 2 ? (y->scales[u / 2] & 15) | code << 4 : code);
	for (int l = 0; l < 2; l++)
		y->qs[2 * u + l] = (uint16_t)(e[l] | (b->signs[2 * u + l] & 127) << 9);
}

static void store_iq3_xxs(void *blk, const struct iq_block *b, int u, int code, const int *e)
{
	uint8_t *q = ((struct block_iq3_xxs *)blk)->qs;
	uint32_t signs = (uint32_t)code << 28;
	for (int l = 0; l < 8; l++)
		q[8 * u + l] = (uint8_t)e[l];
	for (int l = 0; l < 4; l++)
		signs |= (uint32_t)(b->signs[4 * u + l] & 127) << (7 * l);
	for (int i = 0; i < 4; i++)
		q[64 + 4 * u + i] = (uint8_t)(signs >> (8 * i));
}

static void store_iq2_s(void *blk, const struct iq_block *b, int u, int code, const int *e)
{
	struct block_iq2_s *y = blk;
	y->scales[u / 2] = (uint8_t)(u % 2 ? (y->scales[u / 2] & 15) | code << 4 : code);
	for (int l = 0; l < 2; l++) {
		const int g = 2 * u + l;
		y->qs[g] = (uint8_t)e[l];
		y->qh[g / 4] |= (uint8_t)((e[l] >> 8) << (2 * (g % 4)));
		y->qs[32 + g] = b->signs[g];
	}
}

static void store_iq3_s(void *blk, const struct iq_block *b, int u, int code, const int *e)
{
	struct block_iq3_s *y = blk;
	y->scales[u / 2] = (uint8_t)(u % 2 ? (y->scales[u / 2] & 15) | code << 4 : code);
	for (int p = 0; p < 8; p++) {
		y->qs[8 * u + p] = (uint8_t)e[p];
		y->qh[u] |= (uint8_t)((e[p] >> 8) << p);
	}
	for (int l = 0; l < 4; l++)
		y->signs[4 * u + l] = b->signs[4 * u + l];
}

/* n / 256 blocks of `bytes` each: the f16 d first, then what `store` writes. */
static void quantize_iq(const float *x, void *dst, size_t n, const void *grid, size_t bytes,
                        const struct iq_scheme *sc)
{
	struct iq_grid g;
	struct iq_block b;
	grid_decode(grid, sc->grid_n, sc->grid_w, &g);
	const int parts = QK_K / sc->grid_w, nu = parts / sc->unit_parts;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		uint8_t *blk = (uint8_t *)dst + i * bytes;
		float units[QK_K / 16];
		block_prepare(x, &g, sc->even_signs, &b);
		for (int u = 0; u < nu; u++)
			units[u] = unit_scale(&g, &b, u * sc->unit_parts, sc->unit_parts);
		memset(blk, 0, bytes);
		const uint16_t d16 = super_scale(units, nu, sc->k);
		memcpy(blk, &d16, sizeof(d16));
		const float d = f16(d16);
		for (int u = 0; u < nu; u++) {
			const int p0 = u * sc->unit_parts;
			const int c = unit_code(&g, &b, p0, sc->unit_parts, units[u], d, sc->k);
			const float db = d * (0.5f + (float)c) * sc->k;
			int e[8];
			for (int p = 0; p < sc->unit_parts; p++)
				e[p] = part_pick(&g, &b, p0 + p, db);
			sc->store(blk, &b, u, c, e);
		}
	}
}

void moek_quantize_iq2_xxs(const float *x, void *dst, size_t n)
{
	static const struct iq_scheme s = {256, 8, 4, 0.25f, true, store_iq2_xxs};
	quantize_iq(x, dst, n, moek_iq2xxs_grid, sizeof(struct block_iq2_xxs), &s);
}

void moek_quantize_iq2_xs(const float *x, void *dst, size_t n)
{
	static const struct iq_scheme s = {512, 8, 2, 0.25f, true, store_iq2_xs};
	quantize_iq(x, dst, n, moek_iq2xs_grid, sizeof(struct block_iq2_xs), &s);
}

void moek_quantize_iq3_xxs(const float *x, void *dst, size_t n)
{
	static const struct iq_scheme s = {256, 4, 8, 0.5f, true, store_iq3_xxs};
	quantize_iq(x, dst, n, moek_iq3xxs_grid, sizeof(struct block_iq3_xxs), &s);
}

void moek_quantize_iq2_s(const float *x, void *dst, size_t n)
{
	static const struct iq_scheme s = {1024, 8, 2, 0.25f, false, store_iq2_s};
	quantize_iq(x, dst, n, moek_iq2s_grid, sizeof(struct block_iq2_s), &s);
}

void moek_quantize_iq3_s(const float *x, void *dst, size_t n)
{
	/* d · (1 + 2c) = d · (0.5 + c) · 2 */
	static const struct iq_scheme s = {512, 4, 8, 2.0f, false, store_iq3_s};
	quantize_iq(x, dst, n, moek_iq3s_grid, sizeof(struct block_iq3_s), &s);
}

/* ---- IQ1_S -------------------------------------------------------------------------------
 * Ternary entries shifted by ±1/8: the nearest entry of 8 weights at scale S and shift delta is
 * the rounding of each x/S − delta to −1, 0 or 1 when that point is in the grid (about a third
 * of the 3^8 points are); otherwise the cheapest of the points one coordinate away (moved to
 * its second-nearest value) that are, else of those two coordinates away, else the whole
 * grid. The map from the 3^8 points to entries is built once. */

enum { IQ1_POINTS = 6561 };
static uint16_t iq1_map[IQ1_POINTS]; /* point -> entry + 1 (0: not in the grid) */
static pthread_once_t iq1_map_once = PTHREAD_ONCE_INIT;

static void iq1_map_build(void)
{
	for (int e = 0; e < 2048; e++) {
		int code = 0;
		for (int j = IQ_GROUP - 1; j >= 0; j--)
			code = 3 * code + (int8_t)grid_byte(moek_iq1s_grid[e], j) + 1;
		iq1_map[code] = (uint16_t)(e + 1);
	}
}

static float iq1_cost(const float *x, float s, float delta, uint64_t e)
{
	float c = 0.0f;
	for (int j = 0; j < IQ_GROUP; j++) {
		const float r = s * ((float)(int8_t)grid_byte(e, j) + delta) - x[j];
		c += r * r;
	}
	return c;
}

static int iq1_pick(const float *x, float s, float delta)
{
	int t[IQ_GROUP], alt[IQ_GROUP], code = 0;
	static const int pow3[IQ_GROUP] = {1, 3, 9, 27, 81, 243, 729, 2187};
	for (int j = 0; j < IQ_GROUP; j++) {
		const float u = s > 0.0f ? x[j] / s - delta : 0.0f;
		t[j] = u < -0.5f ? -1 : u > 0.5f ? 1 : 0;
		alt[j] = t[j] != 0 ? 0 : u < 0.0f ? -1 : 1; /* the second-nearest value */
		code += (t[j] + 1) * pow3[j];
	}
	if (iq1_map[code])
		return iq1_map[code] - 1;
	int best = -1;
	float best_cost = 0.0f;
	for (int a = 0; a < IQ_GROUP; a++) {
		const int ca = code + (alt[a] - t[a]) * pow3[a];
		for (int b = a; b < IQ_GROUP; b++) {
			const int cb = b == a ? ca : ca + (alt[b] - t[b]) * pow3[b];
			if (!iq1_map[cb])
				continue;
			const float c = iq1_cost(x, s, delta, moek_iq1s_grid[iq1_map[cb] - 1]);
			if (best < 0 || c < best_cost) {
				best = iq1_map[cb] - 1;
				best_cost = c;
			}
		}
	}
	if (best >= 0)
		return best;
	for (int e = 0; e < 2048; e++) {
		const float c = iq1_cost(x, s, delta, moek_iq1s_grid[e]);
		if (best < 0 || c < best_cost) {
			best = e;
			best_cost = c;
		}
	}
	return best;
}

/* Σ x·v and Σ v·v over a unit's 4 groups for the entries picked at (s, delta). */
static void iq1_fit(const float *x, float s, float delta, int *e, float *sxv, float *svv)
{
	*sxv = *svv = 0.0f;
	for (int l = 0; l < 4; l++) {
		e[l] = iq1_pick(x + IQ_GROUP * l, s, delta);
		for (int j = 0; j < IQ_GROUP; j++) {
			const float v = (float)(int8_t)grid_byte(moek_iq1s_grid[e[l]], j) + delta;
			*sxv += x[IQ_GROUP * l + j] * v;
			*svv += v * v;
		}
	}
}

void moek_quantize_iq1_s(const float *src, void *dst, size_t n)
{
	static const float tries[] = {0.3f, 0.4f, 0.5f, 0.6f, 0.75f, 0.9f};
	pthread_once(&iq1_map_once, iq1_map_build);
	struct block_iq1_s *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float x[QK_K], units[QK_K / 32];
		bool neg[QK_K / 32];
		float m = 0.0f;
		for (int k = 0; k < QK_K; k++) {
			const float v = src[k];
			x[k] = v != v ? 0.0f : v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : v;
		}
		for (int u = 0; u < QK_K / 32; u++) {
			const float *xu = x + 32 * u;
			float amax = 0.0f, best_gain = -1.0f;
			for (int k = 0; k < 32; k++)
				amax = fabsf(xu[k]) > amax ? fabsf(xu[k]) : amax;
			units[u] = 0.0f, neg[u] = false;
			if (!(amax > 1e-30f))
				continue;
			for (int sd = 0; sd < 2; sd++) {
				const float delta = sd ? -MOEK_IQ1S_DELTA : MOEK_IQ1S_DELTA;
				for (size_t t = 0; t < sizeof(tries) / sizeof(tries[0]); t++) {
					int e[4];
					float sxv, svv;
					iq1_fit(xu, amax / 1.125f * tries[t], delta, e, &sxv, &svv);
					const float gain = sxv / svv * sxv;
					if (svv > 0.0f && sxv > 0.0f && gain > best_gain) {
						best_gain = gain;
						units[u] = sxv / svv;
						neg[u] = sd;
					}
				}
			}
			m = units[u] > m ? units[u] : m;
		}
		float d = m / 15.0f; /* the largest unit scale on code 7: d · 15 */
		d = d > 65504.0f ? 65504.0f : d;
		y[i].d = moek_f32_to_f16(d);
		const float dd = f16(y[i].d);
		for (int u = 0; u < QK_K / 32; u++) {
			const float *xu = x + 32 * u;
			const float delta = neg[u] ? -MOEK_IQ1S_DELTA : MOEK_IQ1S_DELTA;
			const float v = dd > 0.0f ? (units[u] / dd - 1.0f) * 0.5f : 0.0f;
			const int c0 = !(v > 0.0f) ? 0 : v >= 7.0f ? 7 : (int)lrintf(v);
			int code = c0, e[4];
			float best_cost = 0.0f;
			for (int o = 0; o < 3; o++) { /* the nearest code and its neighbours */
				const int c = c0 + (o == 0 ? 0 : o == 1 ? -1 : 1);
				if (c < 0 || c > 7)
					continue;
				const float dl = dd * (float)(2 * c + 1);
				float cost = 0.0f;
				for (int l = 0; l < 4; l++)
					cost += iq1_cost(
					    xu + IQ_GROUP * l, dl, delta,
					    moek_iq1s_grid[iq1_pick(xu + IQ_GROUP * l, dl, delta)]);
				if (o == 0 || cost < best_cost) {
					best_cost = cost;
					code = c;
				}
			}
			const float dl = dd * (float)(2 * code + 1);
			unsigned qh = (unsigned)code << 12 | (neg[u] ? 0x8000u : 0u);
			for (int l = 0; l < 4; l++) {
				e[l] = iq1_pick(xu + IQ_GROUP * l, dl, delta);
				y[i].qs[4 * u + l] = (uint8_t)e[l];
				qh |= (unsigned)(e[l] >> 8) << (3 * l);
			}
			y[i].qh[u] = (uint16_t)qh;
		}
	}
}

/* IQ1_M: the same search per 16 weights (two groups, each with its own delta) under a 3-bit
 * scale; d maps the largest onto code 7 and is spread over the scale words' top nibbles. */
void moek_quantize_iq1_m(const float *src, void *dst, size_t n)
{
	static const float tries[] = {0.3f, 0.4f, 0.5f, 0.6f, 0.75f, 0.9f};
	pthread_once(&iq1_map_once, iq1_map_build);
	struct block_iq1_m *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, src += QK_K) {
		float x[QK_K], units[QK_K / 16];
		float m = 0.0f;
		for (int k = 0; k < QK_K; k++) {
			const float v = src[k];
			x[k] = v != v ? 0.0f : v > FLT_MAX ? FLT_MAX : v < -FLT_MAX ? -FLT_MAX : v;
		}
		for (int u = 0; u < QK_K / 16; u++) {
			const float *xu = x + 16 * u;
			float amax = 0.0f, best_gain = -1.0f;
			for (int k = 0; k < 16; k++)
				amax = fabsf(xu[k]) > amax ? fabsf(xu[k]) : amax;
			units[u] = 0.0f;
			if (!(amax > 1e-30f))
				continue;
			for (size_t t = 0; t < sizeof(tries) / sizeof(tries[0]); t++) {
				const float s = amax / 1.125f * tries[t];
				float sxv = 0.0f, svv = 0.0f;
				for (int l = 0; l < 2; l++) { /* each group's better delta at s */
					const float *xg = xu + IQ_GROUP * l;
					float best_c = 0.0f, bd = MOEK_IQ1S_DELTA;
					int be = 0;
					for (int sd = 0; sd < 2; sd++) {
						const float delta =
						    sd ? -MOEK_IQ1S_DELTA : MOEK_IQ1S_DELTA;
						const int e = iq1_pick(xg, s, delta);
						const float c =
						    iq1_cost(xg, s, delta, moek_iq1s_grid[e]);
						if (sd == 0 || c < best_c)
							best_c = c, bd = delta, be = e;
					}
					for (int j = 0; j < IQ_GROUP; j++) {
						const float v = (float)(int8_t)grid_byte(
						                    moek_iq1s_grid[be], j) +
						                bd;
						sxv += xg[j] * v;
						svv += v * v;
					}
				}
				const float gain = sxv / svv * sxv;
				if (svv > 0.0f && sxv > 0.0f && gain > best_gain) {
					best_gain = gain;
					units[u] = sxv / svv;
				}
			}
			m = units[u] > m ? units[u] : m;
		}
		float d = m / 15.0f;
		d = d > 65504.0f ? 65504.0f : d;
		const uint16_t d16 = moek_f32_to_f16(d);
		const float dd = f16(d16);
		memset(&y[i], 0, sizeof(y[i]));
		uint16_t sc[4] = {0};
		for (int u = 0; u < QK_K / 16; u++) {
			const float *xu = x + 16 * u;
			const float v = dd > 0.0f ? (units[u] / dd - 1.0f) * 0.5f : 0.0f;
			const int c0 = !(v > 0.0f) ? 0 : v >= 7.0f ? 7 : (int)lrintf(v);
			int code = c0;
			float best_cost = 0.0f;
			for (int o = 0; o < 3; o++) {
				const int c = c0 + (o == 0 ? 0 : o == 1 ? -1 : 1);
				if (c < 0 || c > 7)
					continue;
				const float dl = dd * (float)(2 * c + 1);
				float cost = 0.0f;
				for (int l = 0; l < 2; l++) {
					const float *xg = xu + IQ_GROUP * l;
					const float cp = iq1_cost(
					    xg, dl, MOEK_IQ1S_DELTA,
					    moek_iq1s_grid[iq1_pick(xg, dl, MOEK_IQ1S_DELTA)]);
					const float cn = iq1_cost(
					    xg, dl, -MOEK_IQ1S_DELTA,
					    moek_iq1s_grid[iq1_pick(xg, dl, -MOEK_IQ1S_DELTA)]);
					cost += cp < cn ? cp : cn;
				}
				if (o == 0 || cost < best_cost) {
					best_cost = cost;
					code = c;
				}
			}
			sc[u / 4] |= (uint16_t)(code << (3 * (u % 4)));
			const float dl = dd * (float)(2 * code + 1);
			for (int l = 0; l < 2; l++) {
				const int g = 2 * u + l;
				const float *xg = x + IQ_GROUP * g;
				const int ep = iq1_pick(xg, dl, MOEK_IQ1S_DELTA);
				const int en = iq1_pick(xg, dl, -MOEK_IQ1S_DELTA);
				const bool neg =
				    iq1_cost(xg, dl, -MOEK_IQ1S_DELTA, moek_iq1s_grid[en]) <
				    iq1_cost(xg, dl, MOEK_IQ1S_DELTA, moek_iq1s_grid[ep]);
				const int e = neg ? en : ep;
				y[i].qs[g] = (uint8_t)e;
				y[i].qh[g / 2] |=
				    (uint8_t)(((e >> 8) | (neg ? 8 : 0)) << (4 * (g % 2)));
			}
		}
		for (int k = 0; k < 4; k++)
			sc[k] |= (uint16_t)(((d16 >> (4 * k)) & 15) << 12);
		memcpy(y[i].scales, sc, sizeof(sc));
	}
}
