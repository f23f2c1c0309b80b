/* trace.c — routing traces (see trace.h): a strict parser that names the line and field of
 * every error, the writer (the exact inverse of the parser), and the synthetic generator. */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "presets.h"
#include "splitmix.h"

void trace_free(struct routing_trace *t)
{
	free(t->lines);
	free(t->ids);
	free(t->scores);
	free(t->prefetches);
	free(t->pf_ids);
	memset(t, 0, sizeof(*t));
}

static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	uint64_t n = *cap ? (uint64_t)*cap * 2 : 256;
	while (n < need)
		n *= 2;
	if (n > UINT32_MAX)
		return -ENOMEM;
	void *p = realloc(*arr, n * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = (uint32_t)n;
	return 0;
}

static int trace_append_line(struct routing_trace *t, uint32_t step, uint32_t layer)
{
	if (grow((void **)&t->lines, &t->cap_lines, t->n_lines + 1, sizeof(*t->lines)))
		return -ENOMEM;
	t->lines[t->n_lines++] = (struct trace_line){step, layer, t->n_refs, 0};
	return 0;
}

static int trace_append_ref(struct routing_trace *t, uint32_t id, float score)
{
	uint32_t cap = t->cap_refs;
	if (grow((void **)&t->ids, &cap, t->n_refs + 1, sizeof(*t->ids)))
		return -ENOMEM;
	if (t->scored) {
		uint32_t cap2 = t->cap_refs;
		if (grow((void **)&t->scores, &cap2, t->n_refs + 1, sizeof(*t->scores)))
			return -ENOMEM;
	}
	t->cap_refs = cap;
	t->ids[t->n_refs] = id;
	if (t->scored)
		t->scores[t->n_refs] = score;
	t->n_refs++;
	t->lines[t->n_lines - 1].count++;
	return 0;
}

/* A cursor over one line of the input. */
struct cursor {
	const char *p, *end;
};

static void skip_blanks(struct cursor *c)
{
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r'))
		c->p++;
}

/* Decimal u32 without sign; fails on no digits or overflow. */
static int parse_u32(struct cursor *c, uint32_t *out)
{
	uint64_t v = 0;
	const char *start = c->p;
	while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
		v = v * 10 + (uint64_t)(*c->p - '0');
		if (v > UINT32_MAX)
			return -1;
		c->p++;
	}
	if (c->p == start)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* A score: digits with an optional fraction ("0.25", "1", ".5"); no exponent, no sign. */
static int parse_score(struct cursor *c, float *out)
{
	double v = 0, scale = 1;
	int digits = 0;
	while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 20) {
		v = v * 10 + (*c->p++ - '0');
		digits++;
	}
	if (c->p < c->end && *c->p == '.') {
		c->p++;
		while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 40) {
			scale /= 10;
			v += (*c->p++ - '0') * scale;
			digits++;
		}
	}
	if (!digits)
		return -1;
	*out = (float)v;
	return 0;
}

/* "name:line: " and the message; returns -1. */
static int parse_err(struct sidecar_error *err, int status, const char *name, uint64_t line_no,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int parse_err(struct sidecar_error *err, int status, const char *name, uint64_t line_no,
                     const char *fmt, ...)
{
	if (!err)
		return -1;
	err->status = status;
	int n =
	    snprintf(err->msg, sizeof(err->msg), "%s:%llu: ", name, (unsigned long long)line_no);
	if (n >= 0 && (size_t)n < sizeof(err->msg)) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg + n, sizeof(err->msg) - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

/* "key=value" with value a u32 in [1, max]. */
static int parse_header_field(struct cursor *c, const char *key, uint32_t max, uint32_t *out)
{
	size_t klen = strlen(key);
	skip_blanks(c);
	if ((size_t)(c->end - c->p) <= klen || memcmp(c->p, key, klen) || c->p[klen] != '=')
		return -1;
	c->p += klen + 1;
	if (parse_u32(c, out) || *out == 0 || *out > max)
		return -1;
	return 0;
}

static int parse_header(struct cursor *c, struct routing_trace *t)
{
	static const char magic[] = "moe-trace";
	uint32_t version;
	if ((size_t)(c->end - c->p) < sizeof(magic) - 1 || memcmp(c->p, magic, sizeof(magic) - 1))
		return -1;
	c->p += sizeof(magic) - 1;
	skip_blanks(c);
	if (parse_u32(c, &version) || version != 1)
		return -2;
	if (parse_header_field(c, "n_layers", TRACE_MAX_LAYERS, &t->n_layers) ||
	    parse_header_field(c, "n_experts", TRACE_MAX_EXPERTS, &t->n_experts) ||
	    parse_header_field(c, "top_k", TRACE_MAX_TOPK, &t->top_k))
		return -3;
	skip_blanks(c);
	if (c->p != c->end)
		return -3;
	if ((uint64_t)t->n_layers * t->n_experts > TRACE_MAX_IDS || t->top_k > t->n_experts)
		return -4;
	return 0;
}

/* "p LAYER IDS" (the 'p' consumed): loads started before the next reference line. */
static int parse_prefetch_line(struct cursor *c, struct routing_trace *t, const char *name,
                               uint64_t line_no, struct sidecar_error *err)
{
	uint32_t layer;
	skip_blanks(c);
	if (parse_u32(c, &layer))
		return parse_err(err, MOE_EINVAL, name, line_no,
		                 "prefetch line: expected a layer number after 'p'");
	if (layer >= t->n_layers)
		return parse_err(err, MOE_EINVAL, name, line_no,
		                 "prefetch line: layer %u out of range (n_layers %u)", layer,
		                 t->n_layers);
	skip_blanks(c);
	if (grow((void **)&t->prefetches, &t->cap_prefetches, t->n_prefetches + 1,
	         sizeof(*t->prefetches)))
		return parse_err(err, MOE_ENOMEM, name, line_no, "out of memory");
	struct trace_prefetch *pf = &t->prefetches[t->n_prefetches];
	*pf = (struct trace_prefetch){t->n_lines, layer, t->n_pf_ids, 0};
	for (;;) {
		uint32_t id;
		if (parse_u32(c, &id))
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "prefetch line: expected an expert id");
		if (id >= t->n_experts)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "prefetch line: expert id %u out of range (n_experts %u)",
			                 id, t->n_experts);
		for (uint32_t i = pf->first; i < pf->first + pf->count; i++)
			if (t->pf_ids[i] == id)
				return parse_err(err, MOE_EINVAL, name, line_no,
				                 "prefetch line: expert %u listed twice", id);
		if (pf->count >= TRACE_MAX_TOPK)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "prefetch line: more than %u experts", TRACE_MAX_TOPK);
		if (grow((void **)&t->pf_ids, &t->cap_pf_ids, t->n_pf_ids + 1, sizeof(*t->pf_ids)))
			return parse_err(err, MOE_ENOMEM, name, line_no, "out of memory");
		t->pf_ids[t->n_pf_ids++] = id;
		pf->count++;
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			continue;
		}
		skip_blanks(c);
		if (c->p != c->end)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "prefetch line: unexpected '%c' after the expert list "
			                 "(prefetch ids have no scores)",
			                 *c->p);
		t->n_prefetches++;
		return 0;
	}
}

/* layer_epoch[l] = epoch of the last step that had a line for layer l (epochs count steps). */
struct step_layers {
	uint32_t *layer_epoch;
	uint32_t epoch;
};

static int parse_body_line(struct cursor *c, struct routing_trace *t, struct step_layers *seen,
                           const char *name, uint64_t line_no, struct sidecar_error *err)
{
	uint32_t step, layer;
	if (parse_u32(c, &step))
		return parse_err(err, MOE_EINVAL, name, line_no, "expected a step number");
	if (t->n_lines && step < t->lines[t->n_lines - 1].step)
		return parse_err(err, MOE_EINVAL, name, line_no,
		                 "step %u after step %u (steps never "
		                 "decrease)",
		                 step, t->lines[t->n_lines - 1].step);
	skip_blanks(c);
	if (parse_u32(c, &layer))
		return parse_err(err, MOE_EINVAL, name, line_no, "expected a layer number");
	if (layer >= t->n_layers)
		return parse_err(err, MOE_EINVAL, name, line_no,
		                 "layer %u out of range (n_layers %u)", layer, t->n_layers);
	if (!t->n_lines || step != t->lines[t->n_lines - 1].step)
		seen->epoch++;
	if (seen->layer_epoch[layer] == seen->epoch)
		return parse_err(err, MOE_EINVAL, name, line_no,
		                 "step %u layer %u listed twice (one line per step and layer)",
		                 step, layer);
	seen->layer_epoch[layer] = seen->epoch;
	skip_blanks(c);
	if (trace_append_line(t, step, layer))
		return parse_err(err, MOE_ENOMEM, name, line_no, "out of memory");
	const uint32_t first = t->n_refs;
	for (;;) {
		uint32_t id;
		float score = -1;
		if (parse_u32(c, &id))
			return parse_err(err, MOE_EINVAL, name, line_no, "expected an expert id");
		if (id >= t->n_experts)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "expert id %u out of range (n_experts %u)", id,
			                 t->n_experts);
		bool has_score = c->p < c->end && *c->p == ':';
		if (has_score) {
			c->p++;
			if (parse_score(c, &score) || !(score <= 1.0f))
				return parse_err(err, MOE_EINVAL, name, line_no,
				                 "expert %u: score is not a number in [0, 1]", id);
		}
		if (t->n_lines == 1 && first == 0 && t->n_refs == 0) {
			t->scored = has_score;
		} else if (has_score != t->scored) {
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "expert %u: %s score (a trace is scored throughout or not "
			                 "at all)",
			                 id, has_score ? "unexpected" : "missing");
		}
		for (uint32_t i = first; i < t->n_refs; i++)
			if (t->ids[i] == id)
				return parse_err(err, MOE_EINVAL, name, line_no,
				                 "expert %u listed twice", id);
		if (t->n_refs - first >= t->top_k)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "more than top_k=%u experts", t->top_k);
		if (trace_append_ref(t, id, score))
			return parse_err(err, MOE_ENOMEM, name, line_no, "out of memory");
		if (c->p < c->end && *c->p == ',') {
			c->p++;
			continue;
		}
		skip_blanks(c);
		if (c->p != c->end)
			return parse_err(err, MOE_EINVAL, name, line_no,
			                 "unexpected '%c' after the expert list", *c->p);
		return 0;
	}
}

int trace_parse(const char *text, size_t len, const char *name, struct routing_trace *out,
                struct sidecar_error *err)
{
	struct routing_trace t = {0};
	struct step_layers seen = {0};
	const char *p = text, *end = text + len;
	uint64_t line_no = 0;
	bool have_header = false;
	int rc = 0;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		line_no++;
		if (!nl) {
			/* Whole lines only: a writer cut short (a full disk) leaves a line that
			 * may parse as a different one ("17:0" for "17:0.3125"). */
			const unsigned long long at = (unsigned long long)(p - text);
			rc = parse_err(err, MOE_EINVAL, name, line_no,
			               "the last line (from byte %llu) has no newline: the trace "
			               "was cut short; cut it back to its first %llu bytes to read "
			               "the rest",
			               at, at);
			goto fail;
		}
		struct cursor c = {p, nl};
		p = nl + 1;
		skip_blanks(&c);
		if (c.p == c.end || *c.p == '#')
			continue;
		if (memchr(c.p, '\0', (size_t)(c.end - c.p))) {
			rc = parse_err(err, MOE_EINVAL, name, line_no, "NUL byte in a text trace");
			goto fail;
		}
		if (!have_header) {
			int h = parse_header(&c, &t);
			if (h) {
				rc = parse_err(err, MOE_EINVAL, name, line_no, "%s",
				               h == -1   ? "not a trace: expected 'moe-trace 1 ...'"
				               : h == -2 ? "unsupported trace version (expected 1)"
				               : h == -3
				                   ? "bad header: expected n_layers=N n_experts=N "
				                     "top_k=N (each ≥ 1)"
				                   : "bad header: top_k above n_experts or too "
				                     "many experts in total");
				goto fail;
			}
			have_header = true;
			seen.layer_epoch = calloc(t.n_layers, sizeof(uint32_t));
			if (!seen.layer_epoch) {
				rc = parse_err(err, MOE_ENOMEM, name, line_no, "out of memory");
				goto fail;
			}
			continue;
		}
		if (*c.p == 'p') {
			c.p++;
			rc = parse_prefetch_line(&c, &t, name, line_no, err);
		} else {
			rc = parse_body_line(&c, &t, &seen, name, line_no, err);
		}
		if (rc)
			goto fail;
	}
	if (!have_header) {
		rc =
		    parse_err(err, MOE_EINVAL, name, line_no, "empty trace: no 'moe-trace' header");
		goto fail;
	}
	if (!t.n_lines) {
		rc = parse_err(err, MOE_EINVAL, name, line_no, "trace has a header but no lines");
		goto fail;
	}
	free(seen.layer_epoch);
	*out = t;
	return 0;
fail:
	free(seen.layer_epoch);
	trace_free(&t);
	return rc;
}

int trace_load(const char *path, struct routing_trace *out, struct sidecar_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return error_set(err, MOE_ESYS, "%s: cannot open: %s", path, strerror(e));
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		error_set(err, MOE_ESYS, "%s: fstat: %s", path, strerror(e));
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > (off_t)1 << 34) {
		error_set(err, MOE_EINVAL, "%s: not a regular file of at most 16 GiB", path);
		close(fd);
		return -1;
	}
	size_t size = (size_t)st.st_size;
	char *buf = malloc(size ? size : 1);
	if (!buf) {
		error_set(err, MOE_ENOMEM, "%s: out of memory for %zu bytes", path, size);
		close(fd);
		return -1;
	}
	size_t done = 0;
	while (done < size) {
		ssize_t n = read(fd, buf + done, size - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : EIO;
			error_set(err, MOE_EIO, "%s: read: %s", path,
			          n < 0 ? strerror(e) : "file shrank while reading");
			free(buf);
			close(fd);
			return -1;
		}
		done += (size_t)n;
	}
	close(fd);
	int rc = trace_parse(buf, size, path, out, err);
	free(buf);
	return rc;
}

int trace_format_header(char *buf, size_t cap, uint32_t n_layers, uint32_t n_experts,
                        uint32_t top_k)
{
	const int n = snprintf(buf, cap, "moe-trace 1 n_layers=%u n_experts=%u top_k=%u\n",
	                       n_layers, n_experts, top_k);
	return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}

int trace_format_line(char *buf, size_t cap, uint32_t step, uint32_t layer, const uint32_t *ids,
                      const float *scores, uint32_t count)
{
	size_t len = 0;
	int n = snprintf(buf, cap, "%u %u ", step, layer);
	for (uint32_t j = 0;; j++) {
		if (n < 0 || (size_t)n >= cap - len)
			return -ENOSPC;
		len += (size_t)n;
		if (j == count)
			break;
		n = scores ? snprintf(buf + len, cap - len, "%s%u:%.4f", j ? "," : "", ids[j],
		                      (double)scores[j])
		           : snprintf(buf + len, cap - len, "%s%u", j ? "," : "", ids[j]);
	}
	if (len + 1 >= cap)
		return -ENOSPC;
	buf[len++] = '\n';
	buf[len] = '\0';
	return (int)len;
}

int trace_format_prefetch(char *buf, size_t cap, uint32_t layer, const uint32_t *ids,
                          uint32_t count)
{
	size_t len = 0;
	int n = snprintf(buf, cap, "p %u ", layer);
	for (uint32_t j = 0;; j++) {
		if (n < 0 || (size_t)n >= cap - len)
			return -ENOSPC;
		len += (size_t)n;
		if (j == count)
			break;
		n = snprintf(buf + len, cap - len, "%s%u", j ? "," : "", ids[j]);
	}
	if (len + 1 >= cap)
		return -ENOSPC;
	buf[len++] = '\n';
	buf[len] = '\0';
	return (int)len;
}

int trace_write_header(FILE *f, uint32_t n_layers, uint32_t n_experts, uint32_t top_k)
{
	char buf[TRACE_LINE_MAX];
	const int n = trace_format_header(buf, sizeof(buf), n_layers, n_experts, top_k);
	return n < 0 || fwrite(buf, 1, (size_t)n, f) != (size_t)n ? -EIO : 0;
}

int trace_write_line(FILE *f, uint32_t step, uint32_t layer, const uint32_t *ids,
                     const float *scores, uint32_t count)
{
	char buf[TRACE_LINE_MAX];
	const int n = trace_format_line(buf, sizeof(buf), step, layer, ids, scores, count);
	return n < 0 || fwrite(buf, 1, (size_t)n, f) != (size_t)n ? -EIO : n;
}

int trace_write(FILE *f, const struct routing_trace *t)
{
	if (trace_write_header(f, t->n_layers, t->n_experts, t->top_k) < 0)
		return -EIO;
	uint32_t pf = 0;
	char buf[TRACE_LINE_MAX];
	for (uint32_t i = 0; i <= t->n_lines; i++) {
		for (; pf < t->n_prefetches && t->prefetches[pf].before_line == i; pf++) {
			const struct trace_prefetch *p = &t->prefetches[pf];
			const int n = trace_format_prefetch(buf, sizeof(buf), p->layer,
			                                    t->pf_ids + p->first, p->count);
			if (n < 0 || fwrite(buf, 1, (size_t)n, f) != (size_t)n)
				return -EIO;
		}
		if (i == t->n_lines)
			break;
		const struct trace_line *l = &t->lines[i];
		if (trace_write_line(f, l->step, l->layer, t->ids + l->first,
		                     t->scored ? t->scores + l->first : NULL, l->count) < 0)
			return -EIO;
	}
	return ferror(f) ? -EIO : 0;
}

/* ---- generator ---- */

int trace_gen_preset(const char *model, struct trace_gen_params *out, struct sidecar_error *err)
{
	const struct moe_model_preset *p = moe_model_preset_find(model);
	if (!p) {
		char names[256];
		moe_model_preset_names(names, sizeof(names), ", ");
		return error_set(err, MOE_EINVAL, "unknown model preset '%s' (%s)", model, names);
	}
	const uint32_t step = p->moe_step ? p->moe_step : 1; /* Llama-4 Maverick: every 2nd */
	uint32_t n_moe = 0;
	for (uint32_t L = p->leading_dense; L < p->full_layers; L++)
		n_moe += (L + 1) % step == 0;
	*out = (struct trace_gen_params){
	    .n_layers = n_moe, /* the MoE layers are traced */
	    .n_experts = p->n_experts,
	    .top_k = p->top_k,
	    .steps = 256,
	    .zipf_s = 0.8,
	    .reuse = 0.3,
	    .layer_corr = 0.2,
	    .drift = 0.1,
	    .drift_period = 64,
	    .seed = 1,
	};
	return 0;
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(splitmix64_unit(s) * n) % n;
}

static void shuffle(uint32_t *a, uint32_t n, uint64_t *s)
{
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = rng_below(s, i);
		uint32_t tmp = a[i - 1];
		a[i - 1] = a[j];
		a[j] = tmp;
	}
}

static bool contains(const uint32_t *a, uint32_t n, uint32_t v)
{
	for (uint32_t i = 0; i < n; i++)
		if (a[i] == v)
			return true;
	return false;
}

int trace_generate(const struct trace_gen_params *g, struct routing_trace *out,
                   struct sidecar_error *err)
{
	if (!g->n_layers || g->n_layers > TRACE_MAX_LAYERS || !g->n_experts ||
	    g->n_experts > TRACE_MAX_EXPERTS || !g->top_k || g->top_k > TRACE_MAX_TOPK ||
	    g->top_k > g->n_experts || (uint64_t)g->n_layers * g->n_experts > TRACE_MAX_IDS)
		return error_set(err, MOE_EINVAL,
		                 "generator: bad shape %u layers × %u experts, top_k %u",
		                 g->n_layers, g->n_experts, g->top_k);
	if (!g->steps || !(g->zipf_s >= 0 && g->zipf_s <= 10) ||
	    !(g->reuse >= 0 && g->reuse <= 1) || !(g->layer_corr >= 0 && g->layer_corr <= 1) ||
	    !(g->drift >= 0 && g->drift <= 1))
		return error_set(err, MOE_EINVAL,
		                 "generator: steps must be ≥ 1, zipf in [0, 10], reuse, "
		                 "layer-corr and drift in [0, 1]");
	if ((uint64_t)g->steps * g->n_layers * g->top_k > UINT32_MAX / 2)
		return error_set(err, MOE_EINVAL, "generator: %u steps make too large a trace",
		                 g->steps);
	const uint32_t L = g->n_layers, E = g->n_experts, K = g->top_k;
	uint64_t seed = g->seed;
	struct routing_trace t = {.n_layers = L, .n_experts = E, .top_k = K, .scored = true};
	uint32_t *rank_to_expert = malloc((size_t)L * E * sizeof(uint32_t));
	uint32_t *layer_map = malloc((size_t)L * E * sizeof(uint32_t));
	double *cdf = malloc((size_t)E * sizeof(double));
	uint32_t *prev_token = malloc((size_t)L * K * sizeof(uint32_t));
	uint32_t cur[TRACE_MAX_TOPK], prev_layer[TRACE_MAX_TOPK];
	uint32_t n_prev_layer = 0;
	int rc = -1;
	if (!rank_to_expert || !layer_map || !cdf || !prev_token) {
		error_set(err, MOE_ENOMEM, "generator: out of memory");
		goto out;
	}
	/* Zipf CDF over ranks; rank r has weight 1/(r+1)^s. */
	double sum = 0;
	for (uint32_t r = 0; r < E; r++)
		sum += 1.0 / pow(r + 1.0, g->zipf_s);
	double acc = 0;
	for (uint32_t r = 0; r < E; r++) {
		acc += 1.0 / pow(r + 1.0, g->zipf_s) / sum;
		cdf[r] = acc;
	}
	cdf[E - 1] = 1.0;
	for (uint32_t l = 0; l < L; l++) {
		for (uint32_t e = 0; e < E; e++) {
			rank_to_expert[l * E + e] = e;
			layer_map[l * E + e] = e;
		}
		shuffle(&rank_to_expert[l * E], E, &seed);
		shuffle(&layer_map[l * E], E, &seed);
	}
	for (uint32_t step = 0; step < g->steps; step++) {
		if (g->drift_period && step && step % g->drift_period == 0) {
			uint32_t swaps = (uint32_t)(g->drift * E / 2 + 0.5);
			for (uint32_t l = 0; l < L; l++)
				for (uint32_t s = 0; s < swaps; s++) {
					uint32_t a = rng_below(&seed, E), b = rng_below(&seed, E);
					uint32_t tmp = rank_to_expert[l * E + a];
					rank_to_expert[l * E + a] = rank_to_expert[l * E + b];
					rank_to_expert[l * E + b] = tmp;
				}
		}
		n_prev_layer = 0;
		for (uint32_t l = 0; l < L; l++) {
			uint32_t n = 0;
			for (uint32_t tries = 0; n < K; tries++) {
				uint32_t e;
				double u = splitmix64_unit(&seed);
				if (tries > 64 * K) {
					e = rng_below(&seed, E); /* skewed draws keep colliding */
				} else if (step && u < g->reuse) {
					e = prev_token[l * K + rng_below(&seed, K)];
				} else if (n_prev_layer && u < g->reuse + g->layer_corr) {
					e = layer_map[l * E +
					              prev_layer[rng_below(&seed, n_prev_layer)]];
				} else {
					double z = splitmix64_unit(&seed);
					uint32_t lo = 0, hi = E - 1;
					while (lo < hi) {
						uint32_t mid = (lo + hi) / 2;
						if (cdf[mid] < z)
							lo = mid + 1;
						else
							hi = mid;
					}
					e = rank_to_expert[l * E + lo];
				}
				if (!contains(cur, n, e))
					cur[n++] = e;
			}
			if (trace_append_line(&t, step, l)) {
				error_set(err, MOE_ENOMEM, "generator: out of memory");
				goto out;
			}
			/* Router-like scores: softmax of descending random logits. */
			double logits[TRACE_MAX_TOPK], z = 0, top = 0;
			for (uint32_t i = 0; i < K; i++) {
				top += 0.5 + splitmix64_unit(&seed);
				logits[i] = -top;
				z += exp(logits[i]);
			}
			for (uint32_t i = 0; i < K; i++)
				if (trace_append_ref(&t, cur[i], (float)(exp(logits[i]) / z))) {
					error_set(err, MOE_ENOMEM, "generator: out of memory");
					goto out;
				}
			memcpy(&prev_token[l * K], cur, K * sizeof(uint32_t));
			memcpy(prev_layer, cur, K * sizeof(uint32_t));
			n_prev_layer = K;
		}
	}
	*out = t;
	t = (struct routing_trace){0};
	rc = 0;
out:
	trace_free(&t);
	free(rank_to_expert);
	free(layer_map);
	free(cdf);
	free(prev_token);
	return rc;
}
