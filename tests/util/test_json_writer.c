/* test_json_writer.c — the JSON writer: escaping, nesting and separators, numbers (non-finite
 * as null), truncation and misuse reported, and output the strict reader accepts. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "json_writer.h"

Test(json_writer, escapes_quotes_backslashes_and_every_control_character)
{
	char buf[256];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_string(&w, "a\"b\\c\n\t\x01\x1f\x7f");
	cr_assert_eq(jw_finish(&w), 0);
	cr_assert_str_eq(buf, "\"a\\\"b\\\\c\\u000a\\u0009\\u0001\\u001f\x7f\"");
	cr_assert_eq(jw_length(&w), strlen(buf));
}

Test(json_writer, passes_utf8_through_unchanged)
{
	char buf[64];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_string(&w, "µs — ✓ \xf0\x9f\x98\x80");
	cr_assert_eq(jw_finish(&w), 0);
	cr_assert_str_eq(buf, "\"µs — ✓ \xf0\x9f\x98\x80\"");
}

Test(json_writer, places_commas_and_colons_in_nested_containers)
{
	char buf[256];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w);
	jw_kv_u64(&w, "a", 18446744073709551615u);
	jw_key(&w, "b");
	jw_array_begin(&w);
	jw_i64(&w, -9223372036854775807 - 1);
	jw_object_begin(&w);
	jw_object_end(&w);
	jw_array_begin(&w);
	jw_array_end(&w);
	jw_null(&w);
	jw_array_end(&w);
	jw_kv_bool(&w, "c", true);
	jw_kv_bool(&w, "d", false);
	jw_kv_string(&w, "e\"", "f");
	jw_kv_double(&w, "g", 0.5, 3);
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), 0);
	cr_assert_str_eq(buf, "{\"a\":18446744073709551615,\"b\":[-9223372036854775808,{},[],null],"
	                      "\"c\":true,\"d\":false,\"e\\\"\":\"f\",\"g\":0.500}");
}

Test(json_writer, writes_non_finite_doubles_as_null)
{
	char buf[128];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_array_begin(&w);
	jw_double(&w, NAN, 6);
	jw_double(&w, INFINITY, JW_ROUNDTRIP);
	jw_double(&w, -INFINITY, 2);
	jw_double(&w, 0.1, JW_ROUNDTRIP);
	jw_double(&w, 2.0 / 3.0, 6);
	jw_double(&w, 2.0 / 3.0, JW_SHORT);
	jw_double(&w, 1e-7, JW_SHORT);
	jw_double(&w, NAN, JW_SHORT);
	jw_array_end(&w);
	cr_assert_eq(jw_finish(&w), 0);
	cr_assert_str_eq(buf, "[null,null,null,0.10000000000000001,0.666667,0.666667,1e-07,null]");
}

Test(json_writer, full_precision_doubles_read_back_exactly)
{
	const double v[] = {0.1, 1.0 / 3.0, 1e300, -2.5e-300, 123456789.125};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		char buf[64];
		struct json_writer w;
		jw_init_buffer(&w, buf, sizeof(buf));
		jw_double(&w, v[i], JW_ROUNDTRIP);
		cr_assert_eq(jw_finish(&w), 0);
		cr_assert_eq(strtod(buf, NULL), v[i], "%s", buf);
	}
}

Test(json_writer, reports_truncation_keeps_a_terminated_prefix_and_the_needed_length)
{
	char buf[8];
	memset(buf, 'x', sizeof(buf));
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w);
	jw_kv_string(&w, "key", "value");
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), -ENOBUFS);
	cr_assert_eq(jw_length(&w), strlen("{\"key\":\"value\"}"));
	cr_assert_str_eq(buf, "{\"key\":");

	/* exactly full: the NUL needs a byte too, like snprintf */
	char exact[3];
	jw_init_buffer(&w, exact, sizeof(exact));
	jw_array_begin(&w);
	jw_u64(&w, 7);
	jw_array_end(&w);
	cr_assert_eq(jw_finish(&w), -ENOBUFS);
	cr_assert_eq(jw_length(&w), 3);
	cr_assert_str_eq(exact, "[7");

	/* no buffer: the length only */
	jw_init_buffer(&w, NULL, 0);
	jw_string(&w, "\n");
	cr_assert_eq(jw_finish(&w), -ENOBUFS);
	cr_assert_eq(jw_length(&w), 8);
}

Test(json_writer, reports_misuse)
{
	char buf[64];
	struct json_writer w;

	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w);
	jw_u64(&w, 1); /* a value where a key is due */
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), -EINVAL);

	jw_init_buffer(&w, buf, sizeof(buf));
	jw_array_begin(&w);
	jw_key(&w, "k"); /* a key inside an array */
	cr_assert_eq(jw_finish(&w), -EINVAL);

	jw_init_buffer(&w, buf, sizeof(buf));
	jw_array_begin(&w);
	jw_object_end(&w); /* mismatched end */
	cr_assert_eq(jw_finish(&w), -EINVAL);

	jw_init_buffer(&w, buf, sizeof(buf));
	jw_object_begin(&w); /* never closed */
	cr_assert_eq(jw_finish(&w), -EINVAL);

	jw_init_buffer(&w, buf, sizeof(buf));
	for (unsigned i = 0; i <= JW_MAX_DEPTH; i++)
		jw_array_begin(&w);
	cr_assert_eq(jw_finish(&w), -EINVAL);
}

Test(json_writer, file_output_matches_buffer_output_and_parses_back)
{
	char *mem = NULL;
	size_t mem_len = 0;
	FILE *f = open_memstream(&mem, &mem_len);
	cr_assert_not_null(f);
	char buf[256];
	struct json_writer wf, wb;
	jw_init_file(&wf, f);
	jw_init_buffer(&wb, buf, sizeof(buf));
	struct json_writer *ws[] = {&wf, &wb};
	for (int i = 0; i < 2; i++) {
		struct json_writer *w = ws[i];
		jw_object_begin(w);
		jw_kv_string(w, "name", "tab\there \"q\" \\ é");
		jw_key(w, "list");
		jw_array_begin(w);
		jw_u64(w, 1);
		jw_double(w, NAN, 3);
		jw_double(w, 1.25, 2);
		jw_array_end(w);
		jw_object_end(w);
		cr_assert_eq(jw_finish(w), 0);
	}
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(mem_len, jw_length(&wf));
	cr_assert_str_eq(mem, buf);

	struct json_doc *doc;
	struct sidecar_error err;
	cr_assert_eq(json_parse(buf, strlen(buf), &doc, &err), 0, "%s: %s", buf, err.msg);
	size_t n;
	const char *name = json_string(doc, json_object_get(doc, json_root(doc), "name"), &n);
	cr_assert_eq(n, strlen("tab\there \"q\" \\ é"));
	cr_assert_eq(memcmp(name, "tab\there \"q\" \\ é", n), 0);
	json_ref list = json_object_get(doc, json_root(doc), "list");
	cr_assert_eq(json_count(doc, list), 3);
	cr_assert_eq(json_type_of(doc, json_next(doc, json_first(doc, list))), JSON_NULL);
	json_free(doc);
	free(mem);
}

Test(json_writer, spaced_separators)
{
	char buf[64];
	struct json_writer w;
	jw_init_buffer(&w, buf, sizeof(buf));
	jw_set_spaced(&w, true);
	jw_object_begin(&w);
	jw_key(&w, "a");
	jw_array_begin(&w);
	jw_u64(&w, 1);
	jw_null(&w);
	jw_array_end(&w);
	jw_kv_bool(&w, "b", true);
	jw_object_end(&w);
	cr_assert_eq(jw_finish(&w), 0);
	cr_assert_str_eq(buf, "{\"a\": [1, null], \"b\": true}");
}

Test(json_writer, finish_line_ends_a_complete_document_and_refuses_an_open_one)
{
	char *mem = NULL;
	size_t mem_len = 0;
	FILE *f = open_memstream(&mem, &mem_len);
	cr_assert_not_null(f);
	struct json_writer w;
	jw_init_file(&w, f);
	jw_object_begin(&w);
	jw_kv_u64(&w, "n", 7);
	cr_assert_eq(jw_finish_line(&w), -EINVAL, "an open object got its newline");
	jw_object_end(&w);
	cr_assert_eq(jw_finish_line(&w), 0);
	cr_assert_eq(fclose(f), 0);
	cr_assert_str_eq(mem, "{\"n\":7}\n");
	free(mem);
}
