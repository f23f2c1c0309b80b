/* json_writer.c — see json_writer.h for the contract. */
#include "json_writer.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

void jw_init_buffer(struct json_writer *w, char *buf, size_t cap)
{
	memset(w, 0, sizeof(*w));
	w->buf = buf;
	w->cap = buf ? cap : 0;
	if (w->cap)
		w->buf[0] = '\0';
}

void jw_init_file(struct json_writer *w, FILE *f)
{
	memset(w, 0, sizeof(*w));
	w->file = f;
}

static void fail(struct json_writer *w, int error)
{
	if (!w->error)
		w->error = error;
}

/* Appends n bytes of output. */
static void emit(struct json_writer *w, const char *s, size_t n)
{
	if (w->file) {
		if (!w->error && n && fwrite(s, 1, n, w->file) != n)
			fail(w, errno ? -errno : -EIO);
	} else if (w->cap) {
		if (w->length + n < w->cap) {
			memcpy(w->buf + w->length, s, n);
			w->buf[w->length + n] = '\0';
		} else {
			if (w->length < w->cap) { /* the prefix that fits */
				const size_t fit = w->cap - 1 - w->length;
				memcpy(w->buf + w->length, s, fit);
				w->buf[w->cap - 1] = '\0';
			}
			fail(w, -ENOBUFS);
		}
	} else if (n) {
		fail(w, -ENOBUFS);
	}
	w->length += n;
}

static void emit_str(struct json_writer *w, const char *s)
{
	emit(w, s, strlen(s));
}

void jw_set_spaced(struct json_writer *w, bool spaced)
{
	w->spaced = spaced;
}

static void emit_comma(struct json_writer *w)
{
	emit(w, ", ", w->spaced ? 2 : 1);
}

static bool top_is_object(const struct json_writer *w)
{
	return w->depth && (w->is_object >> (w->depth - 1) & 1u);
}

/* Before a value: the separator it needs, or a misuse (a value where a key is due). */
static void before_value(struct json_writer *w)
{
	if (w->after_key) {
		w->after_key = false;
		return;
	}
	if (top_is_object(w)) {
		fail(w, -EINVAL);
		return;
	}
	if (w->depth) {
		const uint32_t bit = 1u << (w->depth - 1);
		if (w->has_element & bit)
			emit_comma(w);
		w->has_element |= bit;
	}
}

static void begin(struct json_writer *w, bool object)
{
	before_value(w);
	if (w->depth == JW_MAX_DEPTH) {
		fail(w, -EINVAL);
		return;
	}
	const uint32_t bit = 1u << w->depth;
	w->has_element &= ~bit;
	if (object)
		w->is_object |= bit;
	else
		w->is_object &= ~bit;
	w->depth++;
	emit(w, object ? "{" : "[", 1);
}

static void end(struct json_writer *w, bool object)
{
	if (!w->depth || w->after_key || top_is_object(w) != object) {
		fail(w, -EINVAL);
		return;
	}
	w->depth--;
	emit(w, object ? "}" : "]", 1);
}

void jw_object_begin(struct json_writer *w)
{
	begin(w, true);
}

void jw_object_end(struct json_writer *w)
{
	end(w, true);
}

void jw_array_begin(struct json_writer *w)
{
	begin(w, false);
}

void jw_array_end(struct json_writer *w)
{
	end(w, false);
}

/* The string's characters, escaped, without quotes. Runs of plain bytes go out in one emit. */
static void emit_escaped(struct json_writer *w, const char *s, size_t n)
{
	size_t plain = 0;
	for (size_t i = 0; i < n; i++) {
		const unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		emit(w, s + plain, i - plain);
		plain = i + 1;
		char esc[8];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			emit(w, esc, 2);
		} else {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			emit(w, esc, 6);
		}
	}
	emit(w, s + plain, n - plain);
}

void jw_key(struct json_writer *w, const char *key)
{
	if (!top_is_object(w) || w->after_key) {
		fail(w, -EINVAL);
		return;
	}
	const uint32_t bit = 1u << (w->depth - 1);
	if (w->has_element & bit)
		emit_comma(w);
	w->has_element |= bit;
	emit(w, "\"", 1);
	emit_escaped(w, key, strlen(key));
	emit(w, "\": ", w->spaced ? 3 : 2);
	w->after_key = true;
}

void jw_string_n(struct json_writer *w, const char *s, size_t n)
{
	before_value(w);
	emit(w, "\"", 1);
	emit_escaped(w, s, n);
	emit(w, "\"", 1);
}

void jw_string(struct json_writer *w, const char *s)
{
	jw_string_n(w, s, strlen(s));
}

void jw_u64(struct json_writer *w, uint64_t v)
{
	char num[24];
	before_value(w);
	snprintf(num, sizeof(num), "%" PRIu64, v);
	emit_str(w, num);
}

void jw_i64(struct json_writer *w, int64_t v)
{
	char num[24];
	before_value(w);
	snprintf(num, sizeof(num), "%" PRId64, v);
	emit_str(w, num);
}

void jw_double(struct json_writer *w, double v, int decimals)
{
	before_value(w);
	if (!isfinite(v)) {
		emit(w, "null", 4);
		return;
	}
	/* %.*f of a finite double: at most 309 integer digits, a sign, a point, the decimals */
	char num[400];
	if (decimals == JW_SHORT)
		snprintf(num, sizeof(num), "%g", v);
	else if (decimals < 0)
		snprintf(num, sizeof(num), "%.17g", v);
	else
		snprintf(num, sizeof(num), "%.*f", decimals > 60 ? 60 : decimals, v);
	emit_str(w, num);
}

void jw_bool(struct json_writer *w, bool v)
{
	before_value(w);
	emit_str(w, v ? "true" : "false");
}

void jw_null(struct json_writer *w)
{
	before_value(w);
	emit(w, "null", 4);
}

void jw_kv_string(struct json_writer *w, const char *key, const char *s)
{
	jw_key(w, key);
	jw_string(w, s);
}

void jw_kv_u64(struct json_writer *w, const char *key, uint64_t v)
{
	jw_key(w, key);
	jw_u64(w, v);
}

void jw_kv_i64(struct json_writer *w, const char *key, int64_t v)
{
	jw_key(w, key);
	jw_i64(w, v);
}

void jw_kv_double(struct json_writer *w, const char *key, double v, int decimals)
{
	jw_key(w, key);
	jw_double(w, v, decimals);
}

void jw_kv_bool(struct json_writer *w, const char *key, bool v)
{
	jw_key(w, key);
	jw_bool(w, v);
}

size_t jw_length(const struct json_writer *w)
{
	return w->length;
}

int jw_finish(const struct json_writer *w)
{
	if (w->error)
		return w->error;
	if (w->depth || w->after_key)
		return -EINVAL;
	return 0;
}

int jw_finish_line(struct json_writer *w)
{
	const int rc = jw_finish(w);
	if (rc != 0)
		return rc;
	errno = 0;
	if (fputc('\n', w->file) == EOF)
		return errno ? -errno : -EIO;
	return 0;
}
