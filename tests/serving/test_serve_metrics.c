/* test_serve_metrics.c — `serve --metrics`: the endpoints over real HTTP, the exposition as
 * promtool checks it and as a real Prometheus server scrapes it, `stats --prometheus`, the
 * example alerting rules, and the endpoints' answers to bad requests and slow clients.
 *
 * Needs promtool and prometheus (Debian's prometheus package, in scripts/deps.sh); skips
 * saying so without them. No timing thresholds: every wait is for a condition, bounded. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "serve_fixture.h"

#define ALERTS_FILE MOE_SOURCE_DIR "/docs/alerts.yml"

static bool have(const char *tool)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", tool);
	return system(cmd) == 0;
}

static void skip_without_prometheus(void)
{
	if (!have("promtool") || !have("prometheus"))
		cr_skip_test(
		    "promtool and prometheus are not installed (Debian package prometheus; "
		    "scripts/deps.sh installs it)");
}

/* A port nobody listens on now (the kernel's pick for an ephemeral bind). */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	socklen_t len = sizeof(a);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

static int connect_to(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	struct timeval tv = {.tv_sec = 30};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons((uint16_t)port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends request as is and reads the answer until the server closes; returns the HTTP status
 * (0: none, the connection closed or failed first) and *body (malloc'd, may be NULL). */
static int http_raw(int port, const char *request, size_t request_len, char **body)
{
	if (body)
		*body = NULL;
	int fd = connect_to(port);
	if (fd < 0)
		return 0;
	for (size_t off = 0; off < request_len;) {
		ssize_t n = send(fd, request + off, request_len - off, MSG_NOSIGNAL);
		if (n <= 0)
			break; /* the server may refuse before reading it all */
		off += (size_t)n;
	}
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	for (;;) {
		if (len + 4096 > cap)
			cr_assert_not_null(buf = realloc(buf, cap *= 2));
		ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	close(fd);
	int status = 0;
	sscanf(buf, "HTTP/1.%*d %d", &status);
	char *start = strstr(buf, "\r\n\r\n");
	if (body && start)
		*body = strdup(start + 4);
	free(buf);
	return status;
}

static int http_get(int port, const char *path, char **body)
{
	char req[512];
	int n = snprintf(req, sizeof(req),
	                 "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
	return http_raw(port, req, (size_t)n, body);
}

/* The value of the sample `name` (no labels) in an exposition; asserts it is there. */
static double sample_of(const char *expo, const char *name)
{
	char head[128];
	snprintf(head, sizeof(head), "\n%s ", name);
	const char *p = strstr(expo, head);
	cr_assert_not_null(p, "no sample %s in:\n%s", name, expo);
	return strtod(p + strlen(head), NULL);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

/* Runs a shell command; returns its exit status, its output (stdout and stderr) in *out. */
static int run(const char *cmd, char **out)
{
	char full[2048];
	snprintf(full, sizeof(full), "%s 2>&1", cmd);
	FILE *p = popen(full, "r");
	cr_assert_not_null(p);
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	size_t n;
	while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0)
		len += n;
	buf[len] = '\0';
	int st = pclose(p);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

static void some_forwards(struct served *s, int n)
{
	for (int i = 0; i < n; i++) {
		struct fwd_case fc;
		fwd_case_make(&fc, 900 + (uint64_t)i, i % 2, 1 + (uint32_t)i % 3, 4,
		              ref_n_experts(s->ref), ref_hidden(s->ref), false);
		struct moe_completion d;
		cr_assert_eq(served_forward(s, &fc, NULL, &d), MOE_OK);
		fwd_case_free(&fc);
	}
}

static void start_with_metrics(struct served *s, int *port)
{
	*port = free_port();
	static char addr[32];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", *port);
	const char *extra[] = {"--metrics", addr, NULL};
	served_start(s, "q8_0", extra);
}

/* The endpoints' answers, and /metrics against STATS and promtool. */
Test(serve_metrics, endpoints_answer_and_promtool_accepts_the_exposition, .timeout = 300)
{
	skip_without_prometheus();
	struct served s;
	int port;
	start_with_metrics(&s, &port);
	char *body;
	cr_expect_eq(http_get(port, "/healthz", &body), 200, "%s", body);
	free(body);
	cr_expect_eq(http_get(port, "/readyz", &body), 200, "%s", body);
	free(body);
	some_forwards(&s, 12);

	/* Traffic stopped: STATS and /metrics say the same. */
	char *json = served_stats(&s);
	const int64_t requests = json_top_u64(json, "requests");
	cr_assert_eq(requests, 12, "%s", json);
	char *expo;
	cr_assert_eq(http_get(port, "/metrics", &expo), 200);
	char *nl_expo;
	cr_assert(asprintf(&nl_expo, "\n%s", expo) > 0);
	cr_expect_eq(sample_of(nl_expo, "moe_sidecar_requests_total"), (double)requests);
	cr_expect_eq(sample_of(nl_expo, "moe_sidecar_tokens_total"),
	             (double)json_top_u64(json, "tokens"));
	cr_expect_eq(sample_of(nl_expo, "moe_sidecar_ready"), 1.0);
	cr_expect(strstr(nl_expo,
	                 "\nmoe_sidecar_request_duration_seconds_bucket{layer=\"0\",le=\"+Inf\"} "),
	          "%s", expo);
	char path[256], *out;
	snprintf(path, sizeof(path), "%s/metrics.txt", s.sp.dir);
	write_file(path, expo);
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
	int rc = run(cmd, &out);
	cr_log_info("promtool check metrics (/metrics): %s", out);
	cr_expect_eq(rc, 0, "promtool check metrics on /metrics: %s", out);
	free(out);

	/* stats --prometheus: the same figures from a STATS reply. */
	snprintf(path, sizeof(path), "%s/stats.prom", s.sp.dir);
	snprintf(cmd, sizeof(cmd), "%s stats --socket %s --prometheus > %s", MOE_SIDECAR_BIN,
	         s.sp.socket, path);
	cr_assert_eq(run(cmd, &out), 0, "%s", out);
	free(out);
	char *prom = slurp(path), *nl_prom;
	cr_assert_not_null(prom);
	cr_assert(asprintf(&nl_prom, "\n%s", prom) > 0);
	cr_expect_eq(sample_of(nl_prom, "moe_sidecar_requests_total"), (double)requests);
	snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
	rc = run(cmd, &out);
	cr_expect_eq(rc, 0, "promtool check metrics on stats --prometheus: %s", out);
	free(out);

	/* The example alerting rules. */
	snprintf(cmd, sizeof(cmd), "promtool check rules %s", ALERTS_FILE);
	rc = run(cmd, &out);
	cr_log_info("%s", out);
	cr_expect_eq(rc, 0, "promtool check rules: %s", out);
	free(out);
	free(prom);
	free(nl_prom);
	free(nl_expo);
	free(expo);
	free(json);
	served_stop(&s);
}

/* Unknown path 404, POST 405, a huge header refused, and a client that sends half a request
 * holds up neither FORWARDs nor the other endpoints. */
Test(serve_metrics, bad_requests_get_errors_and_slow_clients_block_nothing, .timeout = 300)
{
	struct served s;
	int port;
	start_with_metrics(&s, &port);
	char *body;
	cr_expect_eq(http_get(port, "/nope", &body), 404);
	free(body);
	cr_expect_eq(http_get(port, "/metrics/", &body), 404);
	free(body);
	const char post[] = "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	                    "Content-Length: 3\r\n\r\nabc";
	cr_expect_eq(http_raw(port, post, sizeof(post) - 1, &body), 405);
	free(body);
	const size_t big = 64u << 10;
	char *huge = malloc(big + 256);
	cr_assert_not_null(huge);
	int n = snprintf(huge, 256, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ");
	memset(huge + n, 'a', big);
	memcpy(huge + n + big, "\r\n\r\n", 4);
	const int st = http_raw(port, huge, (size_t)n + big + 4, &body);
	cr_expect(st == 0 || st >= 400, "a 64 KiB header got HTTP %d", st);
	free(body);
	free(huge);

	/* Half a request, left open. */
	int slow = connect_to(port);
	cr_assert_geq(slow, 0);
	const char half[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";
	cr_assert_eq(send(slow, half, sizeof(half) - 1, MSG_NOSIGNAL), (ssize_t)sizeof(half) - 1);
	some_forwards(&s, 6);
	cr_expect_eq(http_get(port, "/healthz", &body), 200);
	free(body);
	char *expo;
	cr_expect_eq(http_get(port, "/metrics", &expo), 200);
	cr_expect(strstr(expo, "moe_sidecar_requests_total 6\n"), "%s", expo);
	free(expo);
	close(slow);
	served_stop(&s);
}

/* A non-loopback address needs --metrics-public; a malformed one is refused. */
Test(serve_metrics, public_address_needs_the_explicit_option)
{
	char cmd[512], *out;
	snprintf(cmd, sizeof(cmd), "%s serve --metrics 192.0.2.1:9464", MOE_SIDECAR_BIN);
	cr_expect_eq(run(cmd, &out), 2, "%s", out);
	cr_expect(strstr(out, "not a loopback address") && strstr(out, "--metrics-public"), "%s",
	          out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s serve --metrics 127.0.0.1", MOE_SIDECAR_BIN);
	cr_expect_eq(run(cmd, &out), 2, "%s", out);
	cr_expect(strstr(out, "expected HOST:PORT"), "%s", out);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s serve --metrics-public", MOE_SIDECAR_BIN);
	cr_expect_eq(run(cmd, &out), 2, "%s", out);
	free(out);
}

/* The value of a Prometheus API vector query's first sample, or false while it has none. */
static bool query_value(int port, const char *promql, double *value, char **raw)
{
	char path[512];
	snprintf(path, sizeof(path), "/api/v1/query?query=%s", promql);
	char *body = NULL;
	*raw = NULL;
	if (http_get(port, path, &body) != 200 || !body) {
		free(body);
		return false;
	}
	struct json_doc *d;
	struct sidecar_error err;
	bool got = false;
	if (json_parse(body, strlen(body), &d, &err) == 0) {
		json_ref result =
		    json_object_get(d, json_object_get(d, json_root(d), "data"), "result");
		json_ref first = json_first(d, result);
		if (json_count(d, result) > 0 && first != JSON_NONE) {
			json_ref v = json_object_get(d, first, "value");
			json_ref s = json_next(d, json_first(d, v));
			const char *text = json_string(d, s, NULL);
			if (text) {
				*value = strtod(text, NULL);
				got = true;
			}
		}
		json_free(d);
	}
	*raw = body;
	return got;
}

/* A real Prometheus server scrapes the sidecar; its query API returns what STATS says. */
Test(serve_metrics, prometheus_scrapes_what_stats_reports, .timeout = 300)
{
	skip_without_prometheus();
	struct served s;
	int port;
	start_with_metrics(&s, &port);
	some_forwards(&s, 9);
	char *json = served_stats(&s);
	const int64_t requests = json_top_u64(json, "requests");
	cr_assert_eq(requests, 9, "%s", json);
	free(json);

	const int web = free_port();
	char cfg[256], cfg_text[1024], tsdb[256], plog[256];
	snprintf(cfg, sizeof(cfg), "%s/prometheus.yml", s.sp.dir);
	snprintf(tsdb, sizeof(tsdb), "%s/tsdb", s.sp.dir);
	snprintf(plog, sizeof(plog), "%s/prometheus.log", s.sp.dir);
	snprintf(cfg_text, sizeof(cfg_text),
	         "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
	         "rule_files:\n  - %s\n"
	         "scrape_configs:\n  - job_name: moe-sidecar\n    static_configs:\n"
	         "      - targets: ['127.0.0.1:%d']\n",
	         ALERTS_FILE, port);
	write_file(cfg, cfg_text);
	char listen[64], cfg_opt[300], tsdb_opt[300];
	snprintf(listen, sizeof(listen), "--web.listen-address=127.0.0.1:%d", web);
	snprintf(cfg_opt, sizeof(cfg_opt), "--config.file=%s", cfg);
	snprintf(tsdb_opt, sizeof(tsdb_opt), "--storage.tsdb.path=%s", tsdb);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		FILE *l = freopen(plog, "w", stdout);
		if (!l || dup2(fileno(stdout), 2) < 0)
			_exit(127);
		execlp("prometheus", "prometheus", cfg_opt, tsdb_opt, listen, "--log.level=warn",
		       (char *)NULL);
		_exit(127);
	}
	/* Until the series appears: bounded, polled. */
	double v = -1;
	char *raw = NULL;
	bool got = false;
	for (int tries = 0; tries < 1200 && !got; tries++) {
		free(raw);
		got = query_value(web, "moe_sidecar_requests_total", &v, &raw);
		if (!got) {
			int st;
			cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "prometheus exited: %s",
			             slurp(plog));
			sleep_ms(100);
		}
	}
	cr_log_info("prometheus /api/v1/query?query=moe_sidecar_requests_total: %s",
	            raw ? raw : "(none)");
	cr_expect(got, "no moe_sidecar_requests_total series within 120 s: %s\nlog: %s",
	          raw ? raw : "(no answer)", slurp(plog));
	cr_expect_eq(v, (double)requests, "Prometheus has %g, STATS %lld", v, (long long)requests);
	free(raw);
	char *rules = NULL;
	cr_expect_eq(http_get(web, "/api/v1/rules", &rules), 200);
	cr_expect(rules && strstr(rules, "MoeSidecarNotServing"), "%s", rules ? rules : "");
	free(rules);
	kill(pid, SIGTERM);
	int st;
	cr_expect_eq(waitpid(pid, &st, 0), pid);
	served_stop(&s);
}

/* /readyz is 503 while the model warms up (held by the test hooks) and 200 once READY is said;
 * /healthz is 200 all along (the dispatcher runs from the start); /metrics says ready 0, then
 * 1. */
Test(serve_metrics, readyz_follows_the_warm_up, .timeout = 300)
{
#ifndef MOE_SIDECAR_TESTHOOKS_BIN
	cr_skip_test("needs moe-sidecar-testhooks (MOE_TEST_HOOKS=ON)");
#else
	struct sidecar_proc sp;
	harness_tempdir(&sp);
	char model[160];
	snprintf(model, sizeof(model), "%s/model.gguf", sp.dir);
	cr_assert_eq(ref_generate(model, "q8_0", 7), 0);
	int hold[2], ready[2];
	cr_assert_eq(pipe2(hold, O_CLOEXEC), 0);
	cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
	const int port = free_port();
	char hold_s[16], ready_s[16], instance[48], addr[32];
	snprintf(hold_s, sizeof(hold_s), "%d", hold[0]);
	snprintf(ready_s, sizeof(ready_s), "%d", ready[1]);
	snprintf(instance, sizeof(instance), "test-metrics-%d", (int)getpid());
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	const pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int fd = open(sp.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 ||
		    fcntl(hold[0], F_SETFD, 0) != 0 || fcntl(ready[1], F_SETFD, 0) != 0)
			_exit(126);
		execl(MOE_SIDECAR_TESTHOOKS_BIN, MOE_SIDECAR_TESTHOOKS_BIN, "serve", model,
		      "--socket", sp.socket, "--ready-fd", ready_s, "--debug-hold-warmup", hold_s,
		      "--probes-instance", instance, "--metrics", addr, (char *)NULL);
		_exit(127);
	}
	close(hold[0]);
	close(ready[1]);
	/* Held: the endpoints answer once the HTTP thread listens (before the model). */
	char *body = NULL;
	int st = 0;
	for (int tries = 0; tries < 3000 && st == 0; tries++) {
		st = http_get(port, "/readyz", &body);
		if (st == 0)
			sleep_ms(10);
	}
	cr_expect_eq(st, 503, "/readyz while warming up: %d %s", st, body ? body : "");
	free(body);
	cr_expect_eq(http_get(port, "/healthz", &body), 200, "%s", body ? body : "");
	free(body);
	cr_expect_eq(http_get(port, "/metrics", &body), 200);
	cr_expect(body && strstr(body, "\nmoe_sidecar_ready 0\n"), "%s", body ? body : "");
	free(body);
	close(hold[1]); /* let the warm-up finish */
	char line[256];
	const ssize_t n = read(ready[0], line, sizeof(line) - 1);
	cr_assert_gt(n, 0, "no READY on --ready-fd: %s", slurp(sp.log));
	close(ready[0]);
	cr_expect_eq(http_get(port, "/readyz", &body), 200, "%s", body ? body : "");
	free(body);
	cr_expect_eq(http_get(port, "/metrics", &body), 200);
	cr_expect(body && strstr(body, "\nmoe_sidecar_ready 1\n"), "%s", body ? body : "");
	free(body);
	kill(pid, SIGTERM);
	int ws;
	cr_assert_eq(waitpid(pid, &ws, 0), pid);
	cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit status 0x%x: %s", ws, slurp(sp.log));
	sp.pid = 0;
	sidecar_cleanup(&sp);
#endif
}
