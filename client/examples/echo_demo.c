/* echo_demo.c — `moe-echo-demo --socket PATH`: the channel end to end, verified.
 *
 * Connects to a running moe-sidecar, does N PING round trips, then ECHO round trips over
 * several sizes and every (in, out) dtype pair, checks every output element against
 * moek_convert done locally, prints a summary table (round trips, p50/p99 latency, GB/s of
 * input moved) and exits 0 only if every payload matched.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "latency.h"
#include "moe_client.h"
#include "moe_kernels.h"
#include "moe_proto.h"

/* One request through the channel; returns its latency or 0 on error (printed). */
static uint64_t round_trip(struct moe_client *c, const struct moe_request *r)
{
	uint64_t t0 = monotonic_ns();
	int rc = moe_submit(c, r);
	struct moe_completion done;
	if (rc == MOE_OK)
		rc = moe_wait(c, &done, 5000);
	uint64_t t1 = monotonic_ns();
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-echo-demo: %s: %s\n", moe_strerror(rc), moe_last_error(c));
		return 0;
	}
	if (done.status != MOE_OK || done.user_data != r->user_data || done.slot != r->slot) {
		fprintf(stderr,
		        "moe-echo-demo: completion status=%s user_data=%llu slot=%u, "
		        "expected success for %llu on slot %u\n",
		        moe_strerror(done.status), (unsigned long long)done.user_data, done.slot,
		        (unsigned long long)r->user_data, r->slot);
		return 0;
	}
	return t1 - t0 ? t1 - t0 : 1;
}

static void print_row(const char *what, size_t trips, uint64_t *lat, double bytes_per_trip)
{
	uint64_t total = 0;
	for (size_t i = 0; i < trips; i++)
		total += lat[i];
	double gbps = bytes_per_trip > 0 ? bytes_per_trip * (double)trips / (double)total : 0;
	printf("%-26s %8zu %10.2f %10.2f %8.2f\n", what, trips,
	       (double)percentile_u64(lat, trips, 0.50) / 1000.0,
	       (double)percentile_u64(lat, trips, 0.99) / 1000.0, gbps);
}

int main(int argc, char **argv)
{
	const char *socket_path = NULL;
	long pings = 10000;
	static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
	                                     {"pings", required_argument, NULL, 'p'},
	                                     {"help", no_argument, NULL, 'h'},
	                                     {"version", no_argument, NULL, 'V'},
	                                     {0}};
	int o;
	while ((o = getopt_long(argc, argv, "s:p:h", opts, NULL)) != -1) {
		switch (o) {
		case 's': socket_path = optarg; break;
		case 'p': pings = strtol(optarg, NULL, 10); break;
		case 'h':
			printf("usage: moe-echo-demo [--socket PATH] [--pings N] [--version]\n");
			return 0;
		case 'V':
			printf("moe-echo-demo %s (protocol ABI %u.%u)\n", MOE_VERSION,
			       MOE_ABI_MAJOR, MOE_ABI_MINOR);
			return 0;
		default: return 2;
		}
	}
	if (pings < 1)
		pings = 1;

	const uint32_t hidden = 2048, max_tokens = 512;
	struct moe_connect_opts co = {.socket_path = socket_path,
	                              .max_tokens = max_tokens,
	                              .hidden = hidden,
	                              .n_slots = 2,
	                              .client_name = "echo-demo"};
	struct moe_client *c;
	int rc = moe_connect(&co, &c);
	if (rc != MOE_OK) {
		fprintf(stderr, "moe-echo-demo: %s: %s\n", moe_strerror(rc), moe_connect_error());
		return 1;
	}
	const struct moe_info *info = moe_info(c);
	printf("connected: sidecar pid %u, protocol %u.%u, %u slots, %u tokens x %u, channel "
	       "%.1f MiB\n\n",
	       info->sidecar_pid, info->abi_major, info->abi_minor, info->n_slots, info->max_tokens,
	       info->hidden, (double)info->channel_bytes / (1 << 20));
	printf("%-26s %8s %10s %10s %8s\n", "request", "trips", "p50 us", "p99 us", "GB/s");

	uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)(pings > 1000 ? pings : 1000));
	size_t ref_bytes = (size_t)max_tokens * hidden * 4;
	void *ref = malloc(ref_bytes);
	float *src = malloc(ref_bytes);
	if (!lat || !ref || !src) {
		fprintf(stderr, "moe-echo-demo: out of memory\n");
		return 1;
	}
	struct moe_slot s;
	if ((rc = moe_slot_acquire(c, &s)) != MOE_OK) {
		fprintf(stderr, "moe-echo-demo: slot: %s\n", moe_strerror(rc));
		return 1;
	}
	int failures = 0;
	uint64_t tag = 1;

	for (long i = 0; i < pings; i++) {
		struct moe_request r = {.op = MOE_OP_PING, .slot = s.index, .user_data = tag++};
		if (!(lat[i] = round_trip(c, &r)))
			return 1;
	}
	print_row("ping", (size_t)pings, lat, 0);

	static const uint32_t sizes[] = {1, 7, 64, 512};
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		const uint32_t nt = sizes[si];
		const size_t n = (size_t)nt * hidden;
		for (size_t k = 0; k < n;
		     k++) /* finite values over a wide range, incl. f16 subnormals */
			src[k] = (float)((int)(k * 2654435761u % 20001u) - 10000) *
			         ((k & 7) == 0   ? 1e-7f
			          : (k & 7) == 1 ? 7.0f
			                         : 0.01f);
		for (unsigned in = 0; in < MOE_DTYPE_COUNT; in++) {
			for (unsigned out = 0; out < MOE_DTYPE_COUNT; out++) {
				const size_t trips = nt >= 512 ? 20 : 100;
				moek_convert(in, s.input, MOE_DTYPE_F32, src, n);
				moek_convert(out, ref, in, s.input, n);
				for (size_t t = 0; t < trips; t++) {
					memset(s.output, 0xA5, n * moe_dtype_size(out));
					struct moe_request r = {.op = MOE_OP_ECHO,
					                        .slot = s.index,
					                        .n_tokens = nt,
					                        .in_dtype = (uint8_t)in,
					                        .out_dtype = (uint8_t)out,
					                        .user_data = tag++};
					if (!(lat[t] = round_trip(c, &r)))
						return 1;
					if (memcmp(s.output, ref, n * moe_dtype_size(out)) != 0) {
						fprintf(
						    stderr,
						    "moe-echo-demo: ECHO %u tokens %s->%s: "
						    "output differs from the local conversion\n",
						    nt, moe_dtype_name(in), moe_dtype_name(out));
						failures++;
						break;
					}
				}
				char what[64];
				snprintf(what, sizeof(what), "echo %3u tok %4s->%-4s", nt,
				         moe_dtype_name(in), moe_dtype_name(out));
				print_row(what, trips, lat, (double)(n * moe_dtype_size(in)));
			}
		}
	}
	moe_slot_release(c, s.index);
	moe_close(c);
	free(lat);
	free(ref);
	free(src);
	if (failures) {
		printf("\n%d payload mismatches\n", failures);
		return 1;
	}
	printf("\nall payloads verified\n");
	return 0;
}
