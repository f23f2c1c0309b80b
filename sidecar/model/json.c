/* json.c — see json.h. Recursive descent over a bounded depth; nodes and decoded text go to
 * two growable arrays whose size is proportional to the input consumed so far. */
#include "json.h"

#include <stdlib.h>
#include <string.h>

struct json_node {
	uint8_t type;
	uint32_t next; /* next sibling or JSON_NONE */
	uint32_t a, b; /* container: first child, count; string/number: text offset, length */
	uint32_t key;  /* object member: key text offset */
	uint32_t key_len;
};

struct json_doc {
	struct json_node *nodes;
	uint32_t n_nodes, cap_nodes;
	char *text;
	uint32_t n_text, cap_text;
};

struct json_parser {
	const unsigned char *p, *start, *end;
	struct json_doc *doc;
	struct sidecar_error *err;
};

static int fail_at(struct json_parser *ps, const char *what)
{
	return error_set(ps->err, MOE_EINVAL, "invalid JSON at byte %zu: %s",
	                 (size_t)(ps->p - ps->start), what);
}

static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t ncap = *cap ? (size_t)*cap * 2 : 64;
	while (ncap < need)
		ncap *= 2;
	if (ncap > UINT32_MAX - 1)
		ncap = UINT32_MAX - 1;
	if (ncap < need)
		return -1;
	void *n = realloc(*arr, ncap * elem);
	if (!n)
		return -1;
	*arr = n;
	*cap = (uint32_t)ncap;
	return 0;
}

static json_ref new_node(struct json_parser *ps, uint8_t type)
{
	struct json_doc *d = ps->doc;
	if (grow((void **)&d->nodes, &d->cap_nodes, d->n_nodes + 1, sizeof(*d->nodes))) {
		fail_at(ps, "out of memory");
		return JSON_NONE;
	}
	struct json_node *n = &d->nodes[d->n_nodes];
	memset(n, 0, sizeof(*n));
	n->type = type;
	n->next = JSON_NONE;
	n->a = JSON_NONE;
	return d->n_nodes++;
}

static int text_reserve(struct json_parser *ps, size_t extra)
{
	struct json_doc *d = ps->doc;
	if (extra > UINT32_MAX - 1 - d->n_text ||
	    grow((void **)&d->text, &d->cap_text, d->n_text + (uint32_t)extra, 1))
		return fail_at(ps, "out of memory");
	return 0;
}

static void skip_ws(struct json_parser *ps)
{
	while (ps->p < ps->end &&
	       (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int hex4(struct json_parser *ps, uint32_t *out)
{
	if (ps->end - ps->p < 4)
		return fail_at(ps, "truncated \\u escape");
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		unsigned c = ps->p[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return fail_at(ps, "bad hex digit in \\u escape");
	}
	ps->p += 4;
	*out = v;
	return 0;
}

static void put_utf8(char *o, uint32_t *n, uint32_t cp)
{
	if (cp < 0x80) {
		o[(*n)++] = (char)cp;
	} else if (cp < 0x800) {
		o[(*n)++] = (char)(0xc0 | (cp >> 6));
		o[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		o[(*n)++] = (char)(0xe0 | (cp >> 12));
		o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else {
		o[(*n)++] = (char)(0xf0 | (cp >> 18));
		o[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
		o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[(*n)++] = (char)(0x80 | (cp & 0x3f));
	}
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0 if invalid: overlong
 * forms, surrogates and code points above U+10FFFF are rejected (RFC 3629). */
static size_t utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
	unsigned c = p[0];
	size_t n;
	uint32_t cp, min;
	if (c >= 0xc2 && c <= 0xdf) {
		n = 2, cp = c & 0x1f, min = 0x80;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3, cp = c & 0x0f, min = 0x800;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4, cp = c & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if ((size_t)(end - p) < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return n;
}

/* Parses a string at ps->p (on the opening quote); decoded text goes to the pool, NUL
 * terminated. Decoded length never exceeds the raw length, so the reservation is exact. */
static int parse_string(struct json_parser *ps, uint32_t *off, uint32_t *len)
{
	ps->p++; /* opening quote */
	const unsigned char *q = ps->p;
	while (q < ps->end && *q != '"')
		q += (*q == '\\' && ps->end - q > 1) ? 2 : 1;
	if (q >= ps->end)
		return fail_at(ps, "unterminated string");
	if (text_reserve(ps, (size_t)(q - ps->p) + 1))
		return -1;
	struct json_doc *d = ps->doc;
	char *o = d->text;
	uint32_t n = d->n_text;
	*off = n;
	while (*ps->p != '"') {
		unsigned c = *ps->p;
		if (c < 0x20)
			return fail_at(ps, "control character in string");
		if (c >= 0x80) {
			size_t sl = utf8_seq_len(ps->p, ps->end);
			if (!sl)
				return fail_at(ps, "invalid UTF-8 in string");
			memcpy(o + n, ps->p, sl);
			n += (uint32_t)sl;
			ps->p += sl;
			continue;
		}
		if (c != '\\') {
			o[n++] = (char)c;
			ps->p++;
			continue;
		}
		ps->p++;
		c = *ps->p++;
		switch (c) {
		case '"': o[n++] = '"'; break;
		case '\\': o[n++] = '\\'; break;
		case '/': o[n++] = '/'; break;
		case 'b': o[n++] = '\b'; break;
		case 'f': o[n++] = '\f'; break;
		case 'n': o[n++] = '\n'; break;
		case 'r': o[n++] = '\r'; break;
		case 't': o[n++] = '\t'; break;
		case 'u': {
			uint32_t cp, lo;
			if (hex4(ps, &cp))
				return -1;
			if (cp >= 0xdc00 && cp <= 0xdfff)
				return fail_at(ps, "lone low surrogate in \\u escape");
			if (cp >= 0xd800 && cp <= 0xdbff) {
				if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
					return fail_at(ps, "lone high surrogate in \\u escape");
				ps->p += 2;
				if (hex4(ps, &lo))
					return -1;
				if (lo < 0xdc00 || lo > 0xdfff)
					return fail_at(ps, "bad low surrogate in \\u escape");
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			}
			put_utf8(o, &n, cp);
			break;
		}
		default: ps->p--; return fail_at(ps, "bad escape in string");
		}
		/* an escape could have run past the closing quote found above ("\" at the end) */
		if (ps->p > q)
			return fail_at(ps, "unterminated string");
	}
	ps->p++; /* closing quote */
	*len = n - *off;
	o[n++] = '\0';
	d->n_text = n;
	return 0;
}

/* The end of the run of digits at p, which holds one at least; NULL when it holds none (the
 * error `what` at p). */
static const unsigned char *digit_run(struct json_parser *ps, const unsigned char *p,
                                      const char *what)
{
	if (p >= ps->end || *p < '0' || *p > '9') {
		ps->p = p;
		fail_at(ps, what);
		return NULL;
	}
	while (p < ps->end && *p >= '0' && *p <= '9')
		p++;
	return p;
}

static int parse_number(struct json_parser *ps, json_ref node)
{
	const unsigned char *s = ps->p, *e = ps->end, *p = s;
	if (p < e && *p == '-')
		p++;
	if (p >= e || *p < '0' || *p > '9')
		return fail_at(ps, "bad number");
	if (*p == '0')
		p++;
	else
		while (p < e && *p >= '0' && *p <= '9')
			p++;
	if (p < e && *p == '.') {
		p = digit_run(ps, p + 1, "bad number: digit expected after '.'");
		if (!p)
			return -1;
	}
	if (p < e && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < e && (*p == '+' || *p == '-'))
			p++;
		p = digit_run(ps, p, "bad number: digit expected in exponent");
		if (!p)
			return -1;
	}
	size_t n = (size_t)(p - s);
	if (text_reserve(ps, n + 1))
		return -1;
	struct json_doc *d = ps->doc;
	memcpy(d->text + d->n_text, s, n);
	d->text[d->n_text + n] = '\0';
	d->nodes[node].a = d->n_text;
	d->nodes[node].b = (uint32_t)n;
	d->n_text += (uint32_t)n + 1;
	ps->p = p;
	return 0;
}

/* The literal at ps->p (true, false or null) as a node of its type; JSON_NONE on error. */
static json_ref parse_literal(struct json_parser *ps)
{
	static const struct {
		const char *word;
		enum json_type type;
	} literals[] = {{"true", JSON_TRUE}, {"false", JSON_FALSE}, {"null", JSON_NULL}};
	for (size_t i = 0; i < sizeof(literals) / sizeof(literals[0]); i++) {
		const size_t n = strlen(literals[i].word);
		if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, literals[i].word, n))
			continue;
		const json_ref node = new_node(ps, literals[i].type);
		if (node != JSON_NONE)
			ps->p += n;
		return node;
	}
	fail_at(ps, "unexpected character");
	return JSON_NONE;
}

static int parse_value(struct json_parser *ps, int depth, json_ref *out);

static int parse_container(struct json_parser *ps, int depth, json_ref node, int is_object)
{
	const unsigned char close = is_object ? '}' : ']';
	ps->p++;
	skip_ws(ps);
	if (ps->p < ps->end && *ps->p == close) {
		ps->p++;
		return 0;
	}
	json_ref last = JSON_NONE;
	uint32_t count = 0;
	for (;;) {
		uint32_t key = 0, key_len = 0;
		skip_ws(ps);
		if (is_object) {
			if (ps->p >= ps->end || *ps->p != '"')
				return fail_at(ps, "object key (string) expected");
			if (parse_string(ps, &key, &key_len))
				return -1;
			skip_ws(ps);
			if (ps->p >= ps->end || *ps->p != ':')
				return fail_at(ps, "':' expected after object key");
			ps->p++;
		}
		json_ref child;
		if (parse_value(ps, depth + 1, &child))
			return -1;
		struct json_doc *d = ps->doc;
		d->nodes[child].key = key;
		d->nodes[child].key_len = key_len;
		if (last == JSON_NONE)
			d->nodes[node].a = child;
		else
			d->nodes[last].next = child;
		last = child;
		count++;
		skip_ws(ps);
		if (ps->p >= ps->end)
			return fail_at(ps,
			               is_object ? "unterminated object" : "unterminated array");
		if (*ps->p == ',') {
			ps->p++;
			continue;
		}
		if (*ps->p == close) {
			ps->p++;
			d->nodes[node].b = count;
			return 0;
		}
		return fail_at(ps, is_object ? "',' or '}' expected" : "',' or ']' expected");
	}
}

static int parse_value(struct json_parser *ps, int depth, json_ref *out)
{
	if (depth >= JSON_MAX_DEPTH)
		return fail_at(ps, "nesting deeper than 64 levels");
	skip_ws(ps);
	if (ps->p >= ps->end)
		return fail_at(ps, "value expected, found end of input");
	json_ref node;
	switch (*ps->p) {
	case '{':
	case '[': {
		int is_object = *ps->p == '{';
		node = new_node(ps, is_object ? JSON_OBJECT : JSON_ARRAY);
		if (node == JSON_NONE || parse_container(ps, depth, node, is_object))
			return -1;
		break;
	}
	case '"': {
		node = new_node(ps, JSON_STRING);
		uint32_t off, len;
		if (node == JSON_NONE || parse_string(ps, &off, &len))
			return -1;
		ps->doc->nodes[node].a = off;
		ps->doc->nodes[node].b = len;
		break;
	}
	case 't':
	case 'f':
	case 'n':
		node = parse_literal(ps);
		if (node == JSON_NONE)
			return -1;
		break;
	default:
		if (*ps->p != '-' && (*ps->p < '0' || *ps->p > '9'))
			return fail_at(ps, "unexpected character");
		node = new_node(ps, JSON_NUMBER);
		if (node == JSON_NONE || parse_number(ps, node))
			return -1;
		break;
	}
	*out = node;
	return 0;
}

int json_parse(const char *text, size_t len, struct json_doc **out, struct sidecar_error *err)
{
	*out = NULL;
	if (len > JSON_MAX_INPUT)
		return error_set(err, MOE_EINVAL,
		                 "JSON text of %zu bytes exceeds the %zu-byte limit", len,
		                 JSON_MAX_INPUT);
	struct json_doc *doc = calloc(1, sizeof(*doc));
	if (!doc)
		return error_set(err, MOE_ENOMEM, "out of memory");
	struct json_parser ps = {(const unsigned char *)text, (const unsigned char *)text,
	                         (const unsigned char *)text + len, doc, err};
	json_ref root;
	if (parse_value(&ps, 0, &root)) {
		json_free(doc);
		return -1;
	}
	skip_ws(&ps);
	if (ps.p != ps.end) {
		fail_at(&ps, "trailing characters after the value");
		json_free(doc);
		return -1;
	}
	*out = doc;
	return 0;
}

void json_free(struct json_doc *doc)
{
	if (!doc)
		return;
	free(doc->nodes);
	free(doc->text);
	free(doc);
}

json_ref json_root(const struct json_doc *doc)
{
	(void)doc;
	return 0; /* the first node parsed */
}

static const struct json_node *node_at(const struct json_doc *doc, json_ref v)
{
	return v < doc->n_nodes ? &doc->nodes[v] : NULL;
}

enum json_type json_type_of(const struct json_doc *doc, json_ref v)
{
	const struct json_node *n = node_at(doc, v);
	return n ? (enum json_type)n->type : JSON_NULL;
}

uint32_t json_count(const struct json_doc *doc, json_ref v)
{
	const struct json_node *n = node_at(doc, v);
	return n && (n->type == JSON_ARRAY || n->type == JSON_OBJECT) ? n->b : 0;
}

json_ref json_first(const struct json_doc *doc, json_ref container)
{
	const struct json_node *n = node_at(doc, container);
	return n && (n->type == JSON_ARRAY || n->type == JSON_OBJECT) ? n->a : JSON_NONE;
}

json_ref json_next(const struct json_doc *doc, json_ref v)
{
	const struct json_node *n = node_at(doc, v);
	return n ? n->next : JSON_NONE;
}

const char *json_key(const struct json_doc *doc, json_ref member, size_t *len)
{
	const struct json_node *n = node_at(doc, member);
	if (!n)
		return NULL;
	if (len)
		*len = n->key_len;
	return doc->text ? doc->text + n->key : "";
}

json_ref json_object_get(const struct json_doc *doc, json_ref obj, const char *key)
{
	if (json_type_of(doc, obj) != JSON_OBJECT)
		return JSON_NONE;
	size_t klen = strlen(key);
	for (json_ref m = json_first(doc, obj); m != JSON_NONE; m = json_next(doc, m)) {
		const struct json_node *n = &doc->nodes[m];
		if (n->key_len == klen && !memcmp(doc->text + n->key, key, klen))
			return m;
	}
	return JSON_NONE;
}

const char *json_string(const struct json_doc *doc, json_ref v, size_t *len)
{
	const struct json_node *n = node_at(doc, v);
	if (!n || n->type != JSON_STRING)
		return NULL;
	if (len)
		*len = n->b;
	return doc->text + n->a;
}

int json_u64(const struct json_doc *doc, json_ref v, uint64_t *out)
{
	const struct json_node *n = node_at(doc, v);
	if (!n || n->type != JSON_NUMBER)
		return -1;
	const char *s = doc->text + n->a;
	uint64_t x = 0;
	for (uint32_t i = 0; i < n->b; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		unsigned dgt = (unsigned)(s[i] - '0');
		if (x > (UINT64_MAX - dgt) / 10)
			return -1;
		x = x * 10 + dgt;
	}
	*out = x;
	return 0;
}

int json_double(const struct json_doc *doc, json_ref v, double *out)
{
	const struct json_node *n = node_at(doc, v);
	if (!n || n->type != JSON_NUMBER)
		return -1;
	*out = strtod(doc->text + n->a, NULL); /* the text is a validated JSON number */
	return 0;
}

int json_bool(const struct json_doc *doc, json_ref v, bool *out)
{
	enum json_type t = json_type_of(doc, v);
	if (v == JSON_NONE || (t != JSON_TRUE && t != JSON_FALSE))
		return -1;
	*out = t == JSON_TRUE;
	return 0;
}

static json_ref get_present(const struct json_doc *doc, json_ref obj, const char *key)
{
	json_ref v = json_object_get(doc, obj, key);
	if (v == JSON_NONE || json_type_of(doc, v) == JSON_NULL)
		return JSON_NONE;
	return v;
}

int json_get_u64(const struct json_doc *doc, json_ref obj, const char *key, uint64_t *out)
{
	json_ref v = get_present(doc, obj, key);
	if (v == JSON_NONE)
		return 0;
	return json_u64(doc, v, out) ? -1 : 1;
}

int json_get_double(const struct json_doc *doc, json_ref obj, const char *key, double *out)
{
	json_ref v = get_present(doc, obj, key);
	if (v == JSON_NONE)
		return 0;
	return json_double(doc, v, out) ? -1 : 1;
}

int json_get_bool(const struct json_doc *doc, json_ref obj, const char *key, bool *out)
{
	json_ref v = get_present(doc, obj, key);
	if (v == JSON_NONE)
		return 0;
	return json_bool(doc, v, out) ? -1 : 1;
}
