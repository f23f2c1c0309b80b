/* The format table's invariants (formats.c): every row complete and consistent with the other
 * tables that are indexed by it — the ISAs' per-format ops (by dense index) and the interleaved
 * layouts — and the values callers rely on pinned (ids, indices, alignments, scale layout,
 * activation pairing, split granularity). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "kernels_internal.h"

static size_t n_formats(void)
{
	size_t n = 0;
	while (moek_format_traits_at(n))
		n++;
	return n;
}

static bool power_of_two(size_t v)
{
	return v && (v & (v - 1)) == 0;
}

Test(format_table, every_row_is_complete)
{
	const size_t n = n_formats();
	cr_assert_eq(n, 24, "a format added or lost: update this test's pinned values");
	cr_assert_eq(n, MOEK_FMT_COUNT);
	for (size_t i = 0; i < n; i++) {
		const struct moek_format_traits *t = moek_format_traits_at(i);
		const struct moek_format_info *f = &t->info;
		cr_assert(f->name && f->name[0], "row %zu: no name", i);
		cr_expect_gt(f->block_elems, 0, "%s", f->name);
		cr_expect_gt(f->block_bytes, 0, "%s", f->name);
		cr_expect(power_of_two(f->align) && f->align <= 4, "%s: align %u", f->name,
		          f->align);
		/* consecutive blocks keep the alignment */
		cr_expect_eq(f->block_bytes % f->align, 0, "%s", f->name);
		cr_expect(power_of_two(t->down_split_align), "%s", f->name);
		/* row i is at index i: public id -> index -> row round-trips */
		cr_expect_eq(t, &moek_formats[i]);
		cr_expect_eq(moek_fmt_index(f->format), i, "%s", f->name);
		cr_expect_eq(t->ggml, f->format < MOEK_GGML_ID_END, "%s", f->name);
		/* the reference codecs: per row where the scales are in the blocks, per matrix
		 * (with a scaled row dequantizer) where they are not */
		if (f->scale_block == 0) {
			cr_expect(t->quantize_row && t->dequantize_row, "%s", f->name);
			cr_expect(!t->quantize_scaled && !t->dequantize_row_scaled, "%s", f->name);
		} else {
			cr_expect(!t->quantize_row && !t->dequantize_row, "%s", f->name);
			cr_expect(t->quantize_scaled && t->dequantize_row_scaled, "%s", f->name);
		}
		const struct moek_format_info *act = moek_format_lookup(t->vec_dot_format);
		cr_assert(act, "%s: activation format %u unknown", f->name, t->vec_dot_format);
		cr_expect(t->vec_dot_format == MOEK_F32 || t->vec_dot_format == MOEK_BF16 ||
		              t->vec_dot_format == MOEK_Q8_0 || t->vec_dot_format == MOEK_Q8_K,
		          "%s", f->name);
		/* the public views are the same rows */
		cr_expect_eq(moek_format_at(i), f);
		cr_expect_eq(moek_format_lookup(f->format), f);
		cr_expect_eq(moek_format_traits(f->format), t);
		cr_expect_eq(moek_row_bytes(f->format, 3 * (size_t)f->block_elems),
		             3 * (size_t)f->block_bytes, "%s", f->name);
		cr_expect_eq(moek_format_scale_block(f->format), f->scale_block, "%s", f->name);
	}
	cr_expect_null(moek_format_at(n));
	cr_expect_null(moek_format_traits_at(n));
}

Test(format_table, ids_and_names_are_unique)
{
	const size_t n = n_formats();
	for (size_t i = 0; i < n; i++) {
		const struct moek_format_traits *t = moek_format_traits_at(i);
		for (size_t j = 0; j < i; j++) {
			const struct moek_format_traits *u = moek_format_traits_at(j);
			cr_expect_neq(t->info.format, u->info.format, "rows %zu and %zu", j, i);
			cr_expect_str_neq(t->info.name, u->info.name);
		}
	}
}

/* Every public id maps to its row's index and nothing else to any: the ggml ids through
 * their map, the sidecar's own by offset. */
Test(format_table, public_ids_map_to_dense_indices)
{
	cr_expect_eq(MOEK_FP8_E4M3_B128, 1000);
	cr_expect_eq(MOEK_INT4_G32, 1001);
	cr_expect_eq(moek_fmt_index(MOEK_F32), MOEK_FMT_F32);
	cr_expect_eq(moek_fmt_index(MOEK_Q4_K), MOEK_FMT_Q4_K);
	cr_expect_eq(moek_fmt_index(MOEK_MXFP4), MOEK_FMT_MXFP4);
	cr_expect_eq(moek_fmt_index(MOEK_FP8_E4M3_B128), MOEK_FMT_FP8_E4M3_B128);
	cr_expect_eq(moek_fmt_index(MOEK_INT4_G32), MOEK_FMT_INT4_G32);
	size_t known = 0;
	for (uint32_t id = 0; id < 1100; id++) {
		const enum moek_fmt f = moek_fmt_index(id);
		if (f == MOEK_FMT_NONE) {
			cr_expect_null(moek_format_lookup(id), "id %u", id);
			continue;
		}
		cr_assert_lt(f, MOEK_FMT_COUNT, "id %u", id);
		cr_expect_eq(moek_formats[f].info.format, id, "id %u", id);
		known++;
	}
	cr_expect_eq(known, MOEK_FMT_COUNT);
	/* unknown ids: a ggml one (Q4_1, 3), between the two ranges, past the sidecar's own,
	 * and ids whose difference from the first own id wraps */
	const uint32_t unknown[] = {3, 41, 61, 63, 999, 1002, UINT32_MAX, UINT32_MAX - 999};
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		cr_expect_eq(moek_fmt_index(unknown[i]), MOEK_FMT_NONE, "id %u", unknown[i]);
		cr_expect_null(moek_format_lookup(unknown[i]));
		cr_expect_eq(moek_format_scale_block(unknown[i]), 0);
		cr_expect_eq(moek_row_bytes(unknown[i], 256), 0);
	}
}

Test(format_table, pinned_values)
{
	static const struct {
		uint32_t format, align, scale_block, act, down_split;
		bool x8;
	} want[] = {
	    {MOEK_F32, 4, 0, MOEK_F32, 1, false},
	    {MOEK_F16, 2, 0, MOEK_BF16, 1, false},
	    {MOEK_BF16, 2, 0, MOEK_BF16, 1, true},
	    {MOEK_Q4_0, 2, 0, MOEK_Q8_0, 64, false},
	    {MOEK_Q8_0, 2, 0, MOEK_Q8_0, 1, true},
	    {MOEK_Q2_K, 2, 0, MOEK_Q8_K, 1, true},
	    {MOEK_Q3_K, 2, 0, MOEK_Q8_K, 1, true},
	    {MOEK_Q4_K, 2, 0, MOEK_Q8_K, 1, true},
	    {MOEK_Q5_K, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_Q6_K, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_Q8_K, 4, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ4_NL, 2, 0, MOEK_Q8_0, 64, true},
	    {MOEK_IQ4_XS, 2, 0, MOEK_Q8_K, 1, true},
	    {MOEK_IQ2_XXS, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ2_XS, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ3_XXS, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ3_S, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ1_S, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ1_M, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_IQ2_S, 2, 0, MOEK_Q8_K, 1, false},
	    {MOEK_MXFP4, 1, 0, MOEK_Q8_0, 64, true},
	    {MOEK_NVFP4, 1, 0, MOEK_Q8_0, 64, true},
	    {MOEK_FP8_E4M3_B128, 1, 128, MOEK_F32, 1, false},
	    {MOEK_INT4_G32, 1, 0, MOEK_Q8_0, 64, true},
	};
	cr_assert_eq(sizeof(want) / sizeof(want[0]), n_formats());
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const struct moek_format_traits *t = moek_format_traits(want[i].format);
		cr_assert(t, "format %u missing", want[i].format);
		const char *name = t->info.name;
		cr_expect_eq(t->info.align, want[i].align, "%s", name);
		cr_expect_eq(t->info.scale_block, want[i].scale_block, "%s", name);
		cr_expect_eq(t->vec_dot_format, want[i].act, "%s", name);
		cr_expect_eq(moek_vec_dot_format(want[i].format), want[i].act, "%s", name);
		cr_expect_eq(t->down_split_align, want[i].down_split, "%s", name);
		cr_expect_eq(t->x8 != NULL, want[i].x8, "%s", name);
		cr_expect_eq(moek_interleave_supported(want[i].format), want[i].x8, "%s", name);
		cr_expect_eq(t->info.weight_format, want[i].format != MOEK_Q8_K, "%s", name);
	}
	cr_expect_eq(moek_fp8_scale_bytes(129, 256), 2 * 2 * sizeof(float));
}

/* An interleaved layout moves every byte of the unit it interleaves once: its segments tile
 * the block, vector segments are whole 4-byte words. */
Test(format_table, interleaved_layouts_tile_their_blocks)
{
	for (size_t i = 0; moek_format_traits_at(i); i++) {
		const struct moek_format_traits *t = moek_format_traits_at(i);
		if (!t->x8)
			continue;
		const char *name = t->info.name;
		size_t bytes;
		const size_t elems = moek_x8_block(t->info.format, &bytes);
		cr_assert_gt(elems, 0, "%s", name);
		cr_expect_eq(bytes, moek_row_bytes(t->info.format, elems), "%s", name);
		cr_assert(t->x8->n >= 1 && t->x8->n <= 4, "%s", name);
		uint8_t covered[256] = {0};
		cr_assert_leq(bytes, sizeof(covered));
		size_t total = 0;
		for (size_t s = 0; s < t->x8->n; s++) {
			const struct moek_x8_segment *seg = &t->x8->seg[s];
			cr_expect(seg->bytes > 0, "%s segment %zu", name, s);
			if (seg->vector)
				cr_expect_eq(seg->bytes % 4, 0, "%s segment %zu", name, s);
			else
				cr_expect(seg->bytes == 1 || seg->bytes == 2, "%s segment %zu",
				          name, s);
			cr_assert_leq(seg->offset + seg->bytes, bytes, "%s segment %zu", name, s);
			for (size_t b = seg->offset; b < (size_t)seg->offset + seg->bytes; b++) {
				cr_expect_eq(covered[b], 0, "%s: byte %zu in two segments", name,
				             b);
				covered[b] = 1;
			}
			total += seg->bytes;
		}
		cr_expect_eq(total, bytes, "%s: segments cover %zu of %zu bytes", name, total,
		             bytes);
	}
}

/* The ops tables are indexed by the table's indices: the unknown index has no entry, group
 * dots exist only for formats with an interleaved layout, and the pair-activation formats
 * are the ones with a 64-element split. */
Test(format_table, ops_tables_follow_the_indices)
{
#if defined(__x86_64__)
	const struct moek_isa_ops *ops = &moek_avx2_ops;
	cr_expect(!ops->dot[MOEK_FMT_NONE] && !ops->dot_rows[MOEK_FMT_NONE] &&
	          !ops->dot_x8[MOEK_FMT_NONE]);
	for (unsigned s = 0; s < MOEK_FMT_COUNT; s++) {
		const struct moek_format_traits *t = &moek_formats[s];
		if (t->info.weight_format)
			cr_expect(ops->dot[s], "%s: no AVX2 dot", t->info.name);
		if (ops->dot_x8[s])
			cr_expect(t->x8, "%s: a group dot without a layout", t->info.name);
		/* a private activation only for a format with the dot that reads it */
		if (ops->act[s])
			cr_expect(ops->dot[s], "%s", t->info.name);
		if (ops->act_x8[s])
			cr_expect(ops->dot_x8[s], "%s", t->info.name);
		/* every weight format but F32 (the reference copies) has its prefill dequantizer */
		cr_expect_eq(ops->dequantize[s] != NULL, t->info.weight_format && s != MOEK_FMT_F32,
		             "%s", t->info.name);
		const uint32_t act = moek_isa_act_fmt(ops, s, false);
		cr_expect_eq(act == MOEK_ACT_Q8_0X2, t->down_split_align == 64, "%s", t->info.name);
	}
#else
	cr_skip_test("no SIMD ops table on this architecture");
#endif
}

/* moek_expert_split_align from the table: down's block, its activation's block, side-scale
 * blocks of gate or down, activation pairs. */
Test(format_table, split_alignment_comes_from_the_rows)
{
	static const struct {
		uint32_t gate, down;
		size_t want;
	} cases[] = {
	    {MOEK_BF16, MOEK_BF16, 1},
	    {MOEK_F32, MOEK_F32, 1},
	    {MOEK_Q8_0, MOEK_Q8_0, 32},
	    {MOEK_Q4_K, MOEK_Q6_K, 256},
	    {MOEK_Q4_0, MOEK_Q4_0, 64},
	    {MOEK_MXFP4, MOEK_MXFP4, 64},
	    {MOEK_NVFP4, MOEK_NVFP4, 64},
	    {MOEK_BF16, MOEK_INT4_G32, 64},
	    {MOEK_IQ4_NL, MOEK_IQ4_XS, 256},
	    {MOEK_FP8_E4M3_B128, MOEK_BF16, 128},
	    {MOEK_BF16, MOEK_FP8_E4M3_B128, 128},
	    {MOEK_F16, MOEK_F16, 1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct moek_expert e = {0};
		e.gate.format = e.up.format = cases[i].gate;
		e.down.format = cases[i].down;
		cr_expect_eq(moek_expert_split_align(&e), cases[i].want, "%s / %s",
		             moek_format_lookup(cases[i].gate)->name,
		             moek_format_lookup(cases[i].down)->name);
	}
}

/* Safetensors checkpoints: the float dtypes and FP8 map to their rows, nothing else does. */
Test(format_table, safetensors_dtypes_map_to_their_rows)
{
	static const struct {
		const char *dtype;
		uint32_t format; /* UINT32_MAX: none */
	} cases[] = {
	    {"F32", MOEK_F32},       {"F16", MOEK_F16},
	    {"BF16", MOEK_BF16},     {"F8_E4M3", MOEK_FP8_E4M3_B128},
	    {"F8_E5M2", UINT32_MAX}, {"U8", UINT32_MAX},
	    {"I32", UINT32_MAX},     {"Q4_K", UINT32_MAX},
	    {"", UINT32_MAX},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct moek_format_info *f = moek_format_from_safetensors(cases[i].dtype);
		cr_expect_eq(f ? f->format : UINT32_MAX, cases[i].format, "%s", cases[i].dtype);
	}
}
