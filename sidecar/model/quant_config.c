/* quant_config.c — see quant_config.h. */
#include "quant_config.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define QC "%s: quantization_config: "

static bool str_is(const char *s, const char *want)
{
	return s && !strcmp(s, want);
}

/* A member that is present and neither null nor false (actorder, desc_act …). */
static bool set_to_something(const struct json_doc *doc, json_ref obj, const char *key)
{
	const json_ref v = json_object_get(doc, obj, key);
	return v != JSON_NONE && json_type_of(doc, v) != JSON_NULL &&
	       json_type_of(doc, v) != JSON_FALSE;
}

/* The largest group: far beyond any row, and small enough that nothing below overflows. */
#define GROUP_MAX (1u << 20)

/* `group_size` of obj as JSON gives it: 1 and *gs if a number, 0 if missing or null (shown
 * "(missing)"), -1 if something else (shown "(not a number)"); shown names it for errors. */
static int group_size_read(const struct json_doc *doc, json_ref obj, double *gs, char *shown,
                           size_t len)
{
	const int rc = json_get_double(doc, obj, "group_size", gs);
	if (rc == 1)
		snprintf(shown, len, "%g", *gs);
	else
		snprintf(shown, len, "%s", rc == 0 ? "(missing)" : "(not a number)");
	return rc;
}

/* A group size of elements: a positive multiple of 32 up to GROUP_MAX. Range-checked as a
 * double before the conversion (a double out of an integer's range converted is undefined
 * behaviour; NaN fails every comparison). */
static bool group_size_ok(double gs, uint32_t *group)
{
	if (!(gs >= 32 && gs <= GROUP_MAX))
		return false;
	*group = (uint32_t)gs;
	return (double)*group == gs && *group % 32 == 0;
}

/* "128" or "channel" into buf; returns buf. */
static const char *group_name(bool per_row, uint32_t group, char *buf, size_t len)
{
	if (per_row)
		snprintf(buf, len, "channel");
	else
		snprintf(buf, len, "%u", group);
	return buf;
}

static int read_ct(const struct json_doc *doc, json_ref qc, const char *path,
                   struct moe_quant_config *q, struct sidecar_error *err)
{
	const char *format = json_string(doc, json_object_get(doc, qc, "format"), NULL);
	if (!str_is(format, "pack-quantized"))
		return error_set(err, MOE_EINVAL,
		                 QC "compressed-tensors format %.64s is not supported "
		                    "(pack-quantized INT4 only)",
		                 path, format ? format : "(missing)");
	const json_ref groups = json_object_get(doc, qc, "config_groups");
	if (groups == JSON_NONE || json_type_of(doc, groups) != JSON_OBJECT ||
	    !json_count(doc, groups))
		return error_set(err, MOE_EINVAL,
		                 QC "compressed-tensors config_groups is missing or empty", path);
	for (json_ref g = json_first(doc, groups); g != JSON_NONE; g = json_next(doc, g)) {
		const char *name = json_key(doc, g, NULL);
		const json_ref w = json_object_get(doc, g, "weights");
		if (w == JSON_NONE || json_type_of(doc, w) != JSON_OBJECT)
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s has no weights scheme", path,
			                 name);
		uint64_t bits = 0;
		uint32_t gs = 0;
		double gsd = 0;
		char shown[32], first[32];
		bool sym = false;
		const char *type = json_string(doc, json_object_get(doc, w, "type"), NULL);
		const char *strategy = json_string(doc, json_object_get(doc, w, "strategy"), NULL);
		if (json_get_u64(doc, w, "num_bits", &bits) != 1 || bits != 4)
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: num_bits %llu is not supported "
			                    "(INT4 only)",
			                 path, name, (unsigned long long)bits);
		if (!str_is(type, "int"))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: weight type %.32s is not "
			                    "supported (int only)",
			                 path, name, type ? type : "(missing)");
		if (json_get_bool(doc, w, "symmetric", &sym) != 1 || !sym)
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: asymmetric weights (symmetric "
			                    "false) are not supported (symmetric INT4 only)",
			                 path, name);
		const bool channel = str_is(strategy, "channel");
		if (!channel && !str_is(strategy, "group"))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: strategy %.32s is not supported "
			                    "(group or channel)",
			                 path, name, strategy ? strategy : "(missing)");
		const int has_gs = group_size_read(doc, w, &gsd, shown, sizeof(shown));
		/* channel: one group per output row; compressed-tensors writes group_size null
		 * (or -1, which it reads as channel) */
		if (channel && has_gs != 0 && !(has_gs == 1 && gsd == -1.0))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: group_size %s with strategy "
			                    "channel (one group per row) is not supported (null or "
			                    "-1)",
			                 path, name, shown);
		if (!channel && (has_gs != 1 || !group_size_ok(gsd, &gs)))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: group_size %s is not supported "
			                    "(strategy group: a positive multiple of 32)",
			                 path, name, shown);
		if (set_to_something(doc, w, "actorder"))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: actorder (activation order) is "
			                    "not supported",
			                 path, name);
		if (g != json_first(doc, groups) && (q->per_row != channel || q->group != gs))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups differ in group_size (%s and %s): one "
			                    "scheme for every layer is supported",
			                 path,
			                 group_name(q->per_row, q->group, first, sizeof(first)),
			                 group_name(channel, gs, shown, sizeof(shown)));
		q->group = gs;
		q->per_row = channel;
	}
	q->kind = MOE_QUANT_INT4_CT;
	q->sym = true;
	return 0;
}

static int read_gptq(const struct json_doc *doc, json_ref qc, const char *path,
                     struct moe_quant_config *q, struct sidecar_error *err)
{
	uint64_t bits = 0;
	uint32_t group = 0;
	double gs = 0;
	char shown[32];
	bool flag;
	if (json_get_u64(doc, qc, "bits", &bits) != 1 || bits != 4)
		return error_set(err, MOE_EINVAL, QC "GPTQ bits %llu is not supported (INT4 only)",
		                 path, (unsigned long long)bits);
	/* -1: one group spanning each row, the usual GPTQ setting */
	const int has_gs = group_size_read(doc, qc, &gs, shown, sizeof(shown));
	const bool per_row = has_gs == 1 && gs == -1.0;
	if (!per_row && (has_gs != 1 || !group_size_ok(gs, &group)))
		return error_set(err, MOE_EINVAL,
		                 QC "GPTQ group_size %s is not supported (a positive multiple of "
		                    "32, or -1: one group per row)",
		                 path, shown);
	if (json_get_bool(doc, qc, "desc_act", &flag) == 1 && flag)
		return error_set(err, MOE_EINVAL,
		                 QC "GPTQ desc_act true (activation order) is not supported: INT4 "
		                    "checkpoints need desc_act false",
		                 path);
	q->sym = true;
	if (json_get_bool(doc, qc, "sym", &flag) == 1)
		q->sym = flag;
	const char *cf = json_string(doc, json_object_get(doc, qc, "checkpoint_format"), NULL);
	if (!cf)
		cf = json_string(doc, json_object_get(doc, qc, "format"), NULL);
	if (cf && !str_is(cf, "gptq") && !str_is(cf, "gptq_v2"))
		return error_set(err, MOE_EINVAL,
		                 QC "GPTQ checkpoint_format %.32s is not supported (gptq or "
		                    "gptq_v2)",
		                 path, cf);
	q->kind = MOE_QUANT_GPTQ;
	q->group = group;
	q->per_row = per_row;
	q->gptq_v1 = !str_is(cf, "gptq_v2");
	return 0;
}

static int read_awq(const struct json_doc *doc, json_ref qc, const char *path,
                    struct moe_quant_config *q, struct sidecar_error *err)
{
	uint64_t bits = 0;
	uint32_t group = 0;
	double gs = 0;
	char shown[32];
	bool zp = false;
	const int has_bits = json_get_u64(doc, qc, "bits", &bits);
	if (has_bits == 1)
		snprintf(shown, sizeof(shown), "%llu", (unsigned long long)bits);
	else
		snprintf(shown, sizeof(shown), "%s", has_bits ? "(not a number)" : "(missing)");
	if (has_bits != 1 || bits != 4)
		return error_set(err, MOE_EINVAL, QC "AWQ bits %s is not supported (INT4 only)",
		                 path, shown);
	if (group_size_read(doc, qc, &gs, shown, sizeof(shown)) != 1 || !group_size_ok(gs, &group))
		return error_set(err, MOE_EINVAL,
		                 QC
		                 "AWQ group_size %s is not supported (a positive multiple of 32)",
		                 path, shown);
	const int has_zp = json_get_bool(doc, qc, "zero_point", &zp);
	if (has_zp != 1 || !zp)
		return error_set(err, MOE_EINVAL,
		                 QC "AWQ zero_point %s is not supported (zero_point true: GEMM "
		                    "checkpoints with zero points)",
		                 path,
		                 has_zp == 1   ? "false"
		                 : has_zp == 0 ? "(missing)"
		                               : "(not a boolean)");
	const json_ref v = json_object_get(doc, qc, "version");
	const char *version = json_string(doc, v, NULL);
	if (v != JSON_NONE && (!version || strcasecmp(version, "gemm")))
		return error_set(err, MOE_EINVAL,
		                 QC "AWQ version %.32s is not supported (gemm: AutoAWQ's GEMM "
		                    "packing; gemv and the others pack differently)",
		                 path, version ? version : "(not a string)");
	q->kind = MOE_QUANT_AWQ;
	q->group = group;
	q->sym = false;
	return 0;
}

/* ModelOpt's quantization object (flat in config.json's quantization_config, or
 * hf_quant_config.json's `quantization`): quant_algo NVFP4, group_size 16 where given. */
static int read_modelopt(const struct json_doc *doc, json_ref qc, const char *path, const char *at,
                         struct moe_quant_config *q, struct sidecar_error *err)
{
	const char *algo = json_string(doc, json_object_get(doc, qc, "quant_algo"), NULL);
	if (!algo || strcasecmp(algo, "NVFP4"))
		return error_set(err, MOE_EINVAL,
		                 "%s: %s: ModelOpt quant_algo %.32s is not supported (NVFP4 only)",
		                 path, at, algo ? algo : "(missing)");
	double gs = 0;
	char shown[32];
	const int has = group_size_read(doc, qc, &gs, shown, sizeof(shown));
	if (has != 0 && !(has == 1 && gs == 16.0))
		return error_set(err, MOE_EINVAL,
		                 "%s: %s: ModelOpt NVFP4 group_size %s is not supported (16: one "
		                 "E4M3 scale per 16 weights)",
		                 path, at, shown);
	q->kind = MOE_QUANT_NVFP4;
	q->group = 16;
	return 0;
}

int moe_quant_config_read_modelopt(const struct json_doc *doc, const char *path,
                                   struct moe_quant_config *q, struct sidecar_error *err)
{
	memset(q, 0, sizeof(*q));
	const json_ref qc = json_object_get(doc, json_root(doc), "quantization");
	if (qc == JSON_NONE || json_type_of(doc, qc) != JSON_OBJECT)
		return error_set(err, MOE_EINVAL, "%s: quantization is missing or not an object",
		                 path);
	return read_modelopt(doc, qc, path, "quantization", q, err);
}

int moe_quant_config_read(const struct json_doc *doc, const char *path, struct moe_quant_config *q,
                          struct sidecar_error *err)
{
	memset(q, 0, sizeof(*q));
	const json_ref qc = json_object_get(doc, json_root(doc), "quantization_config");
	if (qc == JSON_NONE || json_type_of(doc, qc) == JSON_NULL)
		return 0;
	if (json_type_of(doc, qc) != JSON_OBJECT)
		return error_set(err, MOE_EINVAL, "%s: quantization_config is not an object", path);
	const char *method = json_string(doc, json_object_get(doc, qc, "quant_method"), NULL);
	if (!method)
		return error_set(err, MOE_EINVAL, QC "quant_method is missing", path);
	if (str_is(method, "fp8") || str_is(method, "mxfp4"))
		return 0; /* told apart by the tensors' dtypes */
	if (str_is(method, "compressed-tensors"))
		return read_ct(doc, qc, path, q, err);
	if (str_is(method, "gptq"))
		return read_gptq(doc, qc, path, q, err);
	if (str_is(method, "awq"))
		return read_awq(doc, qc, path, q, err);
	if (str_is(method, "modelopt"))
		return read_modelopt(doc, qc, path, "quantization_config", q, err);
	return error_set(
	    err, MOE_EINVAL,
	    QC "quant_method %.64s is not supported (compressed-tensors "
	       "pack-quantized INT4, gptq INT4, awq INT4 GEMM, modelopt NVFP4, fp8 and mxfp4 are)",
	    path, method);
}

int moe_quant_layout_of(const struct moe_quant_config *q, uint64_t rows, uint64_t cols,
                        struct moe_quant_layout *l, char *why, size_t why_len)
{
	assert(q->kind != MOE_QUANT_NONE && q->kind != MOE_QUANT_NVFP4);
	assert(q->per_row ? q->group == 0 : q->group % 32 == 0 && q->group > 0);
	memset(l, 0, sizeof(*l));
	if (q->per_row && (cols == 0 || cols % 32 || cols > UINT32_MAX)) {
		snprintf(why, why_len,
		         "one group per row needs rows of a positive multiple of 32 inputs, not "
		         "%" PRIu64,
		         cols);
		return -1;
	}
	const uint64_t g = q->per_row ? cols : q->group;
	if (cols == 0 || cols % g) {
		snprintf(why, why_len,
		         "group size %" PRIu64 " does not divide the row of %" PRIu64 " inputs", g,
		         cols);
		return -1;
	}
	if (rows == 0 || (q->kind != MOE_QUANT_INT4_CT && rows % 8)) {
		snprintf(why, why_len,
		         "%" PRIu64 " outputs, not a%s multiple of 8 (%s packs 8 zero points "
		         "per int32)",
		         rows, rows ? "" : " positive", q->kind == MOE_QUANT_AWQ ? "AWQ" : "GPTQ");
		return -1;
	}
	l->group = (uint32_t)g;
	if (q->kind == MOE_QUANT_GPTQ) {
		l->weights[0] = cols / 8, l->weights[1] = rows;
		l->scales[0] = cols / g, l->scales[1] = rows;
		l->zeros[0] = cols / g, l->zeros[1] = rows / 8;
	} else if (q->kind == MOE_QUANT_AWQ) {
		l->weights[0] = cols, l->weights[1] = rows / 8;
		l->scales[0] = cols / g, l->scales[1] = rows;
		l->zeros[0] = cols / g, l->zeros[1] = rows / 8;
	} else {
		l->weights[0] = rows, l->weights[1] = cols / 8;
		l->scales[0] = rows, l->scales[1] = cols / g;
	}
	return 0;
}

const char *moe_quant_config_describe(const struct moe_quant_config *q, char *buf, size_t len)
{
	char group[32];
	if (q->per_row)
		snprintf(group, sizeof(group), "one group per row");
	else
		snprintf(group, sizeof(group), "group %u", q->group);
	switch (q->kind) {
	case MOE_QUANT_NONE: snprintf(buf, len, "none"); break;
	case MOE_QUANT_INT4_CT:
		snprintf(buf, len, "compressed-tensors pack-quantized INT4, %s", group);
		break;
	case MOE_QUANT_GPTQ:
		snprintf(buf, len, "GPTQ INT4 %s, %s, %s", q->gptq_v1 ? "v1" : "v2", group,
		         q->sym ? "sym" : "asym");
		break;
	case MOE_QUANT_AWQ: snprintf(buf, len, "AWQ INT4 GEMM, %s, zero point", group); break;
	case MOE_QUANT_NVFP4:
		snprintf(buf, len, "ModelOpt NVFP4, E4M3 scale per 16, per-tensor FP32 scale");
		break;
	}
	return buf;
}
