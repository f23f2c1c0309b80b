/* probes_instance.h — which eBPF probe instance a sidecar pins under when `serve` is not
 * given --probes-instance: one that follows the socket it serves, so that two sidecars on one
 * host (different sockets, as they must be) never meet on one instance name.
 *
 * Owns: nothing. Threading: none. Errors: -1 with the error record filled (util/error.h).
 */
#ifndef MOE_SERVING_PROBES_INSTANCE_H
#define MOE_SERVING_PROBES_INSTANCE_H

#include <stddef.h>

#include "error.h"

/* The system socket (the units', libmoe_client's default for root): its instance is
 * "default", as before instances followed the socket. */
#define PROBES_INSTANCE_SYSTEM_SOCKET "/run/moe-sidecar/sidecar.sock"
#define PROBES_INSTANCE_SYSTEM "default"

/* Room for "sock-" and 16 hex digits, and the NUL. */
#define PROBES_INSTANCE_NAME_LEN 22

/* The default instance of a sidecar serving socket_path, into name (PROBES_INSTANCE_NAME_LEN
 * bytes): "default" for PROBES_INSTANCE_SYSTEM_SOCKET, else "sock-" and the 16 hex digits of
 * the 64-bit FNV-1a hash of the socket's canonical path (its directory resolved by realpath,
 * then its name), so "run/s.sock" from /srv and "/srv/run/./s.sock" name one instance. The
 * socket's directory must exist (serve calls this once the socket is bound). */
int probes_instance_for_socket(const char *socket_path, char name[PROBES_INSTANCE_NAME_LEN],
                               struct sidecar_error *err);

#endif
