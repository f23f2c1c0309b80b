/* fmt_iq.c — reference codecs of ggml's lattice i-quants IQ2_XXS and IQ2_XS (ggml types 16 and
 * 17; layouts in kernels_internal.h, codebooks in iq_grids.c).
 *
 * Decoding is ggml's formula, in ggml's order of float operations: the group scale
 * db = d · (0.5 + s) · 0.25, then db · grid byte, then the sign.
 *
 * The quantizers are this project's own and simpler than llama.cpp's importance-weighted
 * search (quality is lower; the blocks are valid and decode the same in any reader). Per group
 * of 8 weights the signs are stored as they are, except that an odd count of minus signs
 * (which the sign table cannot hold) gives up the sign of the group's smallest magnitude. The
 * magnitudes go to the grid entry nearest in squared error at the group's scale: with the
 * dot products a·g of the group with every entry computed once, a scale S picks
 * argmin S²|g|² − 2S a·g (the first entry on a tie). Each scale unit (32 weights for IQ2_XXS,
 * 16 for IQ2_XS) tries six scales from its largest magnitude (which each maps onto the grid's
 * 43 times 0.6 … 1.1), refits each by least squares over the entries it picked, and keeps the
 * fit with the lowest error. The super-block scale d maps the largest unit scale onto the
 * 4-bit code 15; each unit's code is the best of the nearest for d as stored (f16) and its two
 * neighbours, and its groups' entries are picked again for the scale the code gives. Non-finite
 * magnitudes count as 0 (NaN) or the largest float (±inf), and d is clamped to the largest f16, so
 * no value of the input reaches undefined behaviour or a non-finite weight.
 *
 * Pure functions; no allocation (the decoded grid lives on the stack, 18 KiB); thread-safe.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels_internal.h"

enum { IQ_GROUP = 8, IQ_GROUPS = QK_K / IQ_GROUP, IQ_MAX_GRID = 512 };

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

struct iq_grid {
	int n;
	float v[IQ_MAX_GRID][IQ_GROUP];
	float norm[IQ_MAX_GRID]; /* Σ v² */
};

static void grid_decode(const uint64_t *grid, int n, struct iq_grid *g)
{
	g->n = n;
	for (int e = 0; e < n; e++) {
		float s = 0.0f;
		for (int j = 0; j < IQ_GROUP; j++) {
			g->v[e][j] = (float)grid_byte(grid[e], j);
			s += g->v[e][j] * g->v[e][j];
		}
		g->norm[e] = s;
	}
}

/* One group's magnitudes (sanitised), its sign pattern (even count of minus signs), and its
 * dot products with every grid entry. */
struct iq_group {
	float a[IQ_GROUP];
	uint8_t signs;
	float dot[IQ_MAX_GRID];
};

static void group_prepare(const float *x, const struct iq_grid *g, struct iq_group *out)
{
	unsigned m = 0;
	int smallest = 0;
	for (int j = 0; j < IQ_GROUP; j++) {
		float a = fabsf(x[j]);
		a = a != a ? 0.0f : a > FLT_MAX ? FLT_MAX : a; /* NaN, inf */
		out->a[j] = a;
		m |= (unsigned)(x[j] < 0.0f) << j;
		if (a < out->a[smallest])
			smallest = j;
	}
	if (__builtin_popcount(m) & 1)
		m ^= 1u << smallest;
	out->signs = (uint8_t)m;
	for (int e = 0; e < g->n; e++) {
		float s = 0.0f;
		for (int j = 0; j < IQ_GROUP; j++)
			s += g->v[e][j] * out->a[j];
		out->dot[e] = s;
	}
}

/* The entry nearest the group at scale s: argmin s²|g|² − 2s a·g, the first on a tie. */
static int group_pick(const struct iq_grid *g, const struct iq_group *q, float s)
{
	int best = 0;
	float best_cost = s * s * g->norm[0] - 2.0f * s * q->dot[0];
	for (int e = 1; e < g->n; e++) {
		const float cost = s * s * g->norm[e] - 2.0f * s * q->dot[e];
		if (cost < best_cost) {
			best_cost = cost;
			best = e;
		}
	}
	return best;
}

/* The least-squares scale of `ng` groups (0 when they are all zero). */
static float unit_scale(const struct iq_grid *g, const struct iq_group *q, int ng)
{
	static const float tries[] = {0.6f, 0.7f, 0.8f, 0.9f, 1.0f, 1.1f};
	float amax = 0.0f;
	for (int k = 0; k < ng; k++)
		for (int j = 0; j < IQ_GROUP; j++)
			amax = q[k].a[j] > amax ? q[k].a[j] : amax;
	if (!(amax > 1e-30f))
		return 0.0f;
	float best = 0.0f, best_gain = -1.0f;
	for (size_t t = 0; t < sizeof(tries) / sizeof(tries[0]); t++) {
		const float s = amax / 43.0f * tries[t];
		float sga = 0.0f, sgg = 0.0f;
		for (int k = 0; k < ng; k++) {
			const int e = group_pick(g, &q[k], s);
			sga += q[k].dot[e];
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

/* The 4-bit code of unit scale s for the stored super-block scale dd: of the nearest code of
 * dd · (2c + 1) / 8 (clamped to 0..15) and its two neighbours, the one whose scale, with the
 * entries it picks for the unit's `ng` groups, gives the lowest squared error (the nearest
 * on a tie). */
static int unit_code(const struct iq_grid *g, const struct iq_group *q, int ng, float s, float dd)
{
	if (!(dd > 0.0f))
		return 0;
	const float v = (8.0f * (s / dd) - 1.0f) * 0.5f;
	const int c0 = !(v > 0.0f) ? 0 : v >= 15.0f ? 15 : (int)lrintf(v);
	static const int order[3] = {0, -1, 1};
	int best = c0;
	float best_cost = 0.0f;
	for (int o = 0; o < 3; o++) {
		const int c = c0 + order[o];
		if (c < 0 || c > 15)
			continue;
		const float db = dd * (0.5f + (float)c) * 0.25f;
		float cost = 0.0f;
		for (int k = 0; k < ng; k++) {
			const int e = group_pick(g, &q[k], db);
			cost += db * db * g->norm[e] - 2.0f * db * q[k].dot[e];
		}
		if (o == 0 || cost < best_cost) {
			best_cost = cost;
			best = c;
		}
	}
	return best;
}

/* The super-block scale from the largest unit scale (onto code 15), as stored. */
static uint16_t super_scale(const float *units, int nu)
{
	float m = 0.0f;
	for (int u = 0; u < nu; u++)
		m = units[u] > m ? units[u] : m;
	float d = m * 8.0f / 31.0f;
	d = d > 65504.0f ? 65504.0f : d;
	return moek_f32_to_f16(d);
}

void moek_quantize_iq2_xxs(const float *x, void *dst, size_t n)
{
	struct iq_grid g;
	struct iq_group q[IQ_GROUPS];
	grid_decode(moek_iq2xxs_grid, 256, &g);
	struct block_iq2_xxs *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float units[QK_K / 32];
		for (int k = 0; k < IQ_GROUPS; k++)
			group_prepare(x + IQ_GROUP * k, &g, &q[k]);
		for (int u = 0; u < QK_K / 32; u++)
			units[u] = unit_scale(&g, &q[4 * u], 4);
		y[i].d = super_scale(units, QK_K / 32);
		const float d = f16(y[i].d);
		uint8_t *c = (uint8_t *)y[i].qs;
		for (int u = 0; u < QK_K / 32; u++, c += 8) {
			const int s = unit_code(&g, &q[4 * u], 4, units[u], d);
			const float db = d * (0.5f + (float)s) * 0.25f;
			uint32_t signs = (uint32_t)s << 28;
			for (int l = 0; l < 4; l++) {
				c[l] = (uint8_t)group_pick(&g, &q[4 * u + l], db);
				signs |= (uint32_t)(q[4 * u + l].signs & 127) << (7 * l);
			}
			for (int b = 0; b < 4; b++)
				c[4 + b] = (uint8_t)(signs >> (8 * b));
		}
	}
}

void moek_quantize_iq2_xs(const float *x, void *dst, size_t n)
{
	struct iq_grid g;
	struct iq_group q[IQ_GROUPS];
	grid_decode(moek_iq2xs_grid, 512, &g);
	struct block_iq2_xs *y = dst;
	for (size_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float units[QK_K / 16];
		for (int k = 0; k < IQ_GROUPS; k++)
			group_prepare(x + IQ_GROUP * k, &g, &q[k]);
		for (int u = 0; u < QK_K / 16; u++)
			units[u] = unit_scale(&g, &q[2 * u], 2);
		y[i].d = super_scale(units, QK_K / 16);
		const float d = f16(y[i].d);
		memset(y[i].scales, 0, sizeof(y[i].scales));
		for (int u = 0; u < QK_K / 16; u++) {
			const int s = unit_code(&g, &q[2 * u], 2, units[u], d);
			const float db = d * (0.5f + (float)s) * 0.25f;
			y[i].scales[u / 2] |= (uint8_t)(s << (4 * (u % 2)));
			for (int l = 0; l < 2; l++) {
				const struct iq_group *gq = &q[2 * u + l];
				y[i].qs[2 * u + l] =
				    (uint16_t)(group_pick(&g, gq, db) | (gq->signs & 127) << 9);
			}
		}
	}
}
