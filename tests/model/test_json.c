/* test_json.c — the strict JSON parser: exact u64, UTF-8 and escape handling, depth limit,
 * and the error messages hostile headers get. */
#include <criterion/criterion.h>
#include <string.h>

#include "json.h"

static struct json_doc *parse_ok(const char *s)
{
	struct json_doc *doc;
	struct sidecar_error err;
	int rc = json_parse(s, strlen(s), &doc, &err);
	cr_assert_eq(rc, 0, "parse failed: %s", err.msg);
	return doc;
}

static void parse_fails(const char *s, size_t len, const char *needle)
{
	struct json_doc *doc;
	struct sidecar_error err;
	cr_assert_eq(json_parse(s, len, &doc, &err), -1, "accepted: %.*s", (int)len, s);
	cr_assert_not_null(strstr(err.msg, needle), "error '%s' lacks '%s'", err.msg, needle);
}

Test(json, u64_offsets_are_exact_up_to_2_pow_64_minus_1)
{
	struct json_doc *doc = parse_ok("{\"a\":[18446744073709551615, 9007199254740993]}");
	json_ref arr = json_object_get(doc, json_root(doc), "a");
	uint64_t v;
	cr_assert_eq(json_u64(doc, json_first(doc, arr), &v), 0);
	cr_assert_eq(v, UINT64_MAX);
	cr_assert_eq(json_u64(doc, json_next(doc, json_first(doc, arr)), &v), 0);
	cr_assert_eq(v, 9007199254740993ull); /* not representable as a double */
	json_free(doc);
}

Test(json, u64_rejects_overflow_sign_fraction_exponent)
{
	struct json_doc *doc = parse_ok("[18446744073709551616, -1, 1.5, 1e3, 0]");
	json_ref it = json_first(doc, json_root(doc));
	uint64_t v;
	for (int i = 0; i < 4; i++, it = json_next(doc, it))
		cr_assert_eq(json_u64(doc, it, &v), -1, "element %d accepted", i);
	cr_assert_eq(json_u64(doc, it, &v), 0);
	cr_assert_eq(v, 0);
	json_free(doc);
}

Test(json, escapes_and_surrogate_pairs_decode_to_utf8)
{
	struct json_doc *doc = parse_ok("{\"k\\u00e9y\":\"a\\n\\\"\\ud83d\\ude00\\/\"}");
	json_ref m = json_first(doc, json_root(doc));
	size_t len;
	cr_assert_str_eq(json_key(doc, m, &len), "k\xc3\xa9y");
	const char *s = json_string(doc, m, &len);
	cr_assert_eq(len, 8);
	cr_assert_eq(memcmp(s, "a\n\"\xf0\x9f\x98\x80/", 8), 0);
	json_free(doc);
}

Test(json, invalid_utf8_and_lone_surrogates_are_rejected)
{
	parse_fails("[\"\xc0\xaf\"]", 6, "invalid UTF-8");         /* overlong '/' */
	parse_fails("[\"\xed\xa0\x80\"]", 7, "invalid UTF-8");     /* encoded surrogate */
	parse_fails("[\"\xf4\x90\x80\x80\"]", 8, "invalid UTF-8"); /* above U+10FFFF */
	parse_fails("[\"\\ud800\"]", 10, "surrogate");
	parse_fails("[\"\\udc00\"]", 10, "surrogate");
}

Test(json, syntax_errors_name_the_byte)
{
	parse_fails("{\"a\":1,}", 8, "at byte 7");
	parse_fails("[1 2]", 5, "',' or ']' expected");
	parse_fails("{\"a\" 1}", 7, "':' expected");
	parse_fails("[01]", 4, "',' or ']' expected");
	parse_fails("[1.]", 4, "digit expected");
	parse_fails("\"abc", 4, "unterminated string");
	parse_fails("[\"a\tb\"]", 7, "control character");
	parse_fails("{} x", 4, "trailing characters");
	parse_fails("", 0, "end of input");
	parse_fails("[tru]", 5, "unexpected character");
}

Test(json, nesting_is_limited)
{
	char deep[200];
	memset(deep, '[', 65);
	memset(deep + 65, ']', 65);
	parse_fails(deep, 130, "nesting deeper than 64");
	struct json_doc *doc;
	struct sidecar_error err;
	cr_assert_eq(json_parse(deep + 1, 128, &doc, &err), 0, "64 levels rejected: %s", err.msg);
	json_free(doc);
}

Test(json, config_getters_report_absent_and_wrong_types)
{
	struct json_doc *doc = parse_ok("{\"n\":8,\"f\":2.5,\"b\":true,\"s\":\"x\",\"z\":null}");
	json_ref r = json_root(doc);
	uint64_t u;
	double d;
	bool b;
	cr_assert_eq(json_get_u64(doc, r, "n", &u), 1);
	cr_assert_eq(u, 8);
	cr_assert_eq(json_get_u64(doc, r, "missing", &u), 0);
	cr_assert_eq(json_get_u64(doc, r, "z", &u), 0);
	cr_assert_eq(json_get_u64(doc, r, "s", &u), -1);
	cr_assert_eq(json_get_double(doc, r, "f", &d), 1);
	cr_assert_float_eq(d, 2.5, 1e-12);
	cr_assert_eq(json_get_bool(doc, r, "b", &b), 1);
	cr_assert(b);
	cr_assert_eq(json_get_bool(doc, r, "n", &b), -1);
	json_free(doc);
}
