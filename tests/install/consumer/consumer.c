/* consumer.c — an engine-shaped C program built against the INSTALLED libmoe_client (through
 * pkg-config or find_package(MoeClient), statically or dynamically: test_install.sh builds it
 * all four ways). One FORWARD of two experts must equal the sum of each expert's FORWARD.
 * Usage: consumer SOCKET. Exit 0 on success. */
#include <moe_client.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what, int rc, struct moe_client *c)
{
	fprintf(stderr, "consumer-c: %s: %s: %s\n", what, moe_strerror(rc),
	        c ? moe_last_error(c) : moe_connect_error());
	return 1;
}

static int forward(struct moe_client *c, const struct moe_slot *s, int32_t layer, const float *x,
                   uint32_t hidden, const int32_t ids[2], const float w[2], float *out)
{
	memcpy(s->input, x, hidden * sizeof(float));
	memcpy(s->expert_ids, ids, 2 * sizeof(int32_t));
	memcpy(s->expert_weights, w, 2 * sizeof(float));
	struct moe_completion done;
	int rc = moe_forward(c, s, layer, 1, 2, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0, &done, 10000);
	if (rc == MOE_OK)
		memcpy(out, s->output, hidden * sizeof(float));
	return rc;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: consumer SOCKET\n");
		return 2;
	}
	struct moe_connect_opts o;
	memset(&o, 0, sizeof(o));
	o.socket_path = argv[1];
	o.max_tokens = 4;
	o.client_name = "consumer-c";
	struct moe_client *c;
	int rc = moe_connect(&o, &c);
	if (rc != MOE_OK)
		return die("connect", rc, NULL);
	const struct moe_info *inf = moe_info(c);
	if (inf->abi_major != MOE_ABI_MAJOR || inf->n_experts < 2 || !inf->fingerprint[0]) {
		fprintf(stderr, "consumer-c: unexpected info (abi %u, experts %u)\n",
		        inf->abi_major, inf->n_experts);
		return 1;
	}
	int32_t layer;
	rc = moe_model_layers(c, &layer, 1);
	if (rc < 1)
		return die("moe_model_layers", rc, c);
	const uint32_t hidden = inf->hidden;
	float *x = malloc(hidden * sizeof(float)), *both = malloc(hidden * sizeof(float)),
	      *a = malloc(hidden * sizeof(float)), *b = malloc(hidden * sizeof(float));
	for (uint32_t i = 0; i < hidden; i++)
		x[i] = sinf(0.37f * (float)i);
	struct moe_slot s;
	if ((rc = moe_slot_acquire(c, &s)) != MOE_OK)
		return die("acquire", rc, c);
	const int32_t ids2[2] = {0, 1}, ids_a[2] = {0, -1}, ids_b[2] = {1, -1};
	const float w2[2] = {0.25f, 0.75f}, w_a[2] = {0.25f, 0.0f}, w_b[2] = {0.75f, 0.0f};
	if ((rc = forward(c, &s, layer, x, hidden, ids2, w2, both)) != MOE_OK)
		return die("FORWARD", rc, c);
	if ((rc = forward(c, &s, layer, x, hidden, ids_a, w_a, a)) != MOE_OK ||
	    (rc = forward(c, &s, layer, x, hidden, ids_b, w_b, b)) != MOE_OK)
		return die("FORWARD of one expert", rc, c);
	double err = 0, norm = 0;
	for (uint32_t i = 0; i < hidden; i++) {
		err = fmax(err, fabs((double)both[i] - ((double)a[i] + (double)b[i])));
		norm = fmax(norm, fabs((double)both[i]));
	}
	moe_slot_release(c, s.index);
	moe_close(c);
	if (!(norm > 0) || err > 1e-5 * norm + 1e-6) {
		fprintf(stderr, "consumer-c: two experts %g from the sum of each (max |out| %g)\n",
		        err, norm);
		return 1;
	}
	printf("consumer-c: FORWARD of layer %d ok (hidden %u, max |out| %.3g)\n", layer, hidden,
	       norm);
	free(x);
	free(both);
	free(a);
	free(b);
	return 0;
}
