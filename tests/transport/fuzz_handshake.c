/* fuzz_handshake.c — libFuzzer over the handshake parsers (moe_hello_parse and
 * moe_welcome_parse): any bytes, any length. The first byte picks the parser. A parser must
 * never read past len, and whatever it accepts must be self-consistent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const int which = data[0] & 1;
	/* An exact-size heap copy so that any over-read hits ASan's redzone. */
	const size_t len = size - 1;
	uint8_t *buf = malloc(len ? len : 1);
	memcpy(buf, data + 1, len);
	char why[MOE_REASON_LEN];
	if (which == 0) {
		struct moe_hello h;
		int rc = moe_hello_parse(buf, len, &h, why, sizeof(why));
		if (rc == MOE_OK) {
			if (h.magic != MOE_HELLO_MAGIC || h.abi_major != MOE_ABI_MAJOR ||
			    h.size != len || h.want.ring_entries != 0 ||
			    memchr(h.client_name, 0, sizeof(h.client_name)) == NULL)
				abort();
		} else if (rc != MOE_EPROTO && rc != MOE_EVERSION) {
			abort();
		} else if (memchr(why, 0, sizeof(why)) == NULL) {
			abort();
		}
	} else {
		struct moe_welcome w;
		int rc = moe_welcome_parse(buf, len, &w, why, sizeof(why));
		if (rc == MOE_OK) {
			if (w.magic != MOE_WELCOME_MAGIC || w.abi_major != MOE_ABI_MAJOR ||
			    w.size != len || w.status > 0 ||
			    memchr(w.reason, 0, sizeof(w.reason)) == NULL ||
			    memchr(w.model.name, 0, sizeof(w.model.name)) == NULL)
				abort();
			if (w.status == MOE_OK && len < sizeof(w))
				abort();
		} else if (rc != MOE_EPROTO && rc != MOE_EVERSION) {
			abort();
		}
	}
	free(buf);
	return 0;
}
