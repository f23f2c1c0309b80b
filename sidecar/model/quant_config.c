/* quant_config.c — see quant_config.h. */
#include "quant_config.h"

#include <stdio.h>
#include <string.h>

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

static int group_size_ok(uint64_t g)
{
	return g > 0 && g % 32 == 0 && g <= (1u << 20);
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
		uint64_t bits = 0, gs = 0;
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
		if (!str_is(strategy, "group"))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: strategy %.32s is not supported "
			                    "(group only)",
			                 path, name, strategy ? strategy : "(missing)");
		if (json_get_u64(doc, w, "group_size", &gs) != 1 || !group_size_ok(gs))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: group_size %llu is not supported "
			                    "(a multiple of 32)",
			                 path, name, (unsigned long long)gs);
		if (set_to_something(doc, w, "actorder"))
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups.%.64s: actorder (activation order) is "
			                    "not supported",
			                 path, name);
		if (q->group && q->group != gs)
			return error_set(err, MOE_EINVAL,
			                 QC "config_groups differ in group_size (%u and %llu): one "
			                    "scheme for every layer is supported",
			                 path, q->group, (unsigned long long)gs);
		q->group = (uint32_t)gs;
	}
	q->kind = MOE_QUANT_INT4_CT;
	q->sym = true;
	return 0;
}

static int read_gptq(const struct json_doc *doc, json_ref qc, const char *path,
                     struct moe_quant_config *q, struct sidecar_error *err)
{
	uint64_t bits = 0;
	double gs = 0;
	bool flag;
	if (json_get_u64(doc, qc, "bits", &bits) != 1 || bits != 4)
		return error_set(err, MOE_EINVAL, QC "GPTQ bits %llu is not supported (INT4 only)",
		                 path, (unsigned long long)bits);
	if (json_get_double(doc, qc, "group_size", &gs) != 1 || gs != (double)(uint64_t)gs ||
	    !group_size_ok((uint64_t)gs))
		return error_set(err, MOE_EINVAL,
		                 QC "GPTQ group_size %g is not supported (a multiple of 32; -1, "
		                    "one group per row, is not)",
		                 path, gs);
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
	q->group = (uint32_t)gs;
	q->gptq_v1 = !str_is(cf, "gptq_v2");
	return 0;
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
	return error_set(err, MOE_EINVAL,
	                 QC "quant_method %.64s is not supported (compressed-tensors "
	                    "pack-quantized INT4, gptq INT4, fp8 and mxfp4 are)",
	                 path, method);
}

const char *moe_quant_config_describe(const struct moe_quant_config *q, char *buf, size_t len)
{
	switch (q->kind) {
	case MOE_QUANT_NONE: snprintf(buf, len, "none"); break;
	case MOE_QUANT_INT4_CT:
		snprintf(buf, len, "compressed-tensors pack-quantized INT4, group %u", q->group);
		break;
	case MOE_QUANT_GPTQ:
		snprintf(buf, len, "GPTQ INT4 %s, group %u, %s", q->gptq_v1 ? "v1" : "v2", q->group,
		         q->sym ? "sym" : "asym");
		break;
	}
	return buf;
}
