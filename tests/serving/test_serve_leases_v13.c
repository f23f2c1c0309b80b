/* test_serve_leases_v13.c — a client of protocol 1.3 (this library, its hello saying 1.3) at a
 * sidecar that splits each expert's rows over two synthetic NUMA nodes' pools: it is sent the
 * first pool only, its raw LEASE is refused naming why (the split, the protocol it needs),
 * the BF16 form still serves it, and at an unsplit sidecar its leases are as before. */
#include <criterion/criterion.h>
#include <string.h>

#include "serve_fixture.h"

#define SPLIT_ARGS "--threads", "2", "--numa", "synthetic:pack:1 numa:2 core:1 pu:1"

Test(leases_v13, a_split_sidecar_refuses_raw_leases_naming_why)
{
	struct served s;
	const char *const extra[] = {"--leases", "--lease-staging-mib", "4", SPLIT_ARGS, NULL};
	ref_ffn = 512; /* Q4_K's 256-row units: one per node */
	served_start(&s, "q4_k", extra);
	ref_ffn = REF_FFN;
	cr_assert_eq(moe_info(s.c)->abi_minor, MOE_ABI_MINOR, "the sidecar speaks 1.%u",
	             MOE_ABI_MINOR);
	cr_assert_eq(moe_lease_pool_count(s.c), 1, "a 1.3 client is sent one pool");
	const int32_t layer = (int32_t)moe_info(s.c)->first_moe_layer;
	struct moe_lease_expert le[2];
	const int32_t xs[2] = {1, 2};
	const int rc = moe_lease(s.c, layer, xs, 2, 0, le, 10000);
	cr_assert_eq(rc, MOE_ENOLEASE, "%s: %s", moe_strerror(rc), moe_last_error(s.c));
	const char *why = moe_last_error(s.c);
	cr_assert(strstr(why, "2 NUMA nodes") && strstr(why, "1.4") && strstr(why, "1.3"),
	          "the refusal names the split and the protocols: %s", why);
	/* the BF16 form is described in the staging area only: served */
	cr_assert_eq(moe_lease(s.c, layer, xs, 2, MOE_LEASE_BF16, le, 10000), MOE_OK, "%s",
	             moe_last_error(s.c));
	cr_assert_eq(le[0].gate.area, MOE_LEASE_AREA_STAGING);
	cr_assert_eq(moe_lease_release(s.c, NULL, 0, 5000), MOE_OK, "%s", moe_last_error(s.c));
	char *js = served_stats(&s);
	cr_assert_eq(json_top_u64(js, "leases_refused"), 1, "%s", js);
	cr_assert_eq(json_top_u64(js, "leases_held"), 0);
	free(js);
	served_stop(&s);
}

Test(leases_v13, an_unsplit_sidecar_leases_as_before)
{
	struct served s;
	const char *const extra[] = {"--leases", NULL};
	served_start(&s, "q8_0", extra);
	struct moe_lease_expert le[2];
	const int32_t xs[2] = {3, 4};
	cr_assert_eq(moe_lease(s.c, (int32_t)moe_info(s.c)->first_moe_layer, xs, 2, 0, le, 10000),
	             MOE_OK, "%s", moe_last_error(s.c));
	const void *pool;
	cr_assert_eq(moe_lease_pool(s.c, &pool, NULL, NULL), MOE_OK);
	for (int i = 0; i < 2; i++) {
		void *want;
		size_t want_bytes;
		uint32_t format;
		cr_assert_eq(ref_expert_rows(s.ref, le[i].layer, le[i].expert, 2, &want,
		                             &want_bytes, &format),
		             0);
		void *got = malloc(want_bytes);
		cr_assert_eq(le[i].down.area, MOE_LEASE_AREA_POOL);
		cr_assert_eq(moe_lease_deinterleave(&le[i].down, pool, got, want_bytes), MOE_OK);
		cr_assert_eq(memcmp(got, want, want_bytes), 0);
		free(got);
		free(want);
	}
	served_stop(&s);
}
