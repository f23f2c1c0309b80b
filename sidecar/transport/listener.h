/* listener.h — the sidecar's socket on the file system: its directory, the one-sidecar lock
 * file beside it, and the bound listening socket.
 *
 * Owns: a descriptor of the socket's directory, reached by a walk from "/" that opens each
 * component with O_NOFOLLOW and checks it with fstat (every directory ours or root's, no
 * entry on the way replaceable by another uid; the last one writable by nobody else unless
 * sticky). Everything after that
 * — the lock file, removing a stale socket, bind, chmod, and the unlinks at teardown — is done
 * relative to that descriptor, never by path: a symlink planted at the directory's path is
 * refused, and one swapped in later is never followed. Teardown unlinks the socket and the
 * lock file only if the names still lead to the inodes it created.
 *
 * Threading: one thread (the control thread). Errors: -1 with err filled (error.h).
 */
#ifndef MOE_SIDECAR_LISTENER_H
#define MOE_SIDECAR_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/un.h>

#include "error.h"

struct listener {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* what clients connect to */
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];  /* its directory, for messages */
	char name[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* its last component */
	char lock_name[sizeof(((struct sockaddr_un *)0)->sun_path) + 8]; /* name + ".lock" */
	int dir_fd, lock_fd, sock_fd;                                    /* -1 when not open */
	bool adopted;   /* sock_fd was passed (socket activation): not ours to unlink */
	dev_t sock_dev; /* the socket inode bind created */
	ino_t sock_ino;
};

/* Which other uids are to reach the socket: shared (an allow-list) makes the directory
 * 0711 and the socket 0666, SO_PEERCRED deciding; else directory 0700 and socket 0600.
 * The uids are only for a warning: one that cannot search a directory on the path (by its
 * mode bits; ACLs may still let it) is named at start with that directory and its mode. */
struct listener_peers {
	bool shared;
	const uid_t *uids;
	uint32_t n_uids;
};

/* Opens (or creates) the directory of path — refusing a path through a symbolic link, "..",
 * or a directory another uid could change (listener.c says why) — takes the lock file next
 * to the socket (a second sidecar on the same path fails here, naming the first one's pid),
 * removes a stale socket, and binds. The socket is not listening yet: connects are refused
 * until listener_listen. l is fully initialised even on failure; listener_close undoes
 * whatever was done. */
int listener_open(struct listener *l, const char *path, const struct listener_peers *peers,
                  struct sidecar_error *err);

/* Takes a socket another process made and listens on (socket activation): l serves fd and
 * names it path; there is no directory or lock, and listener_close only closes fd. */
void listener_adopt(struct listener *l, int fd, const char *path);

/* Starts accepting connections (non-blocking socket). */
int listener_listen(struct listener *l, int backlog, struct sidecar_error *err);

/* Closes the socket; unlinks the socket and the lock file if they are still the ones this
 * listener made (a file renamed over either name is left alone, with a warning); releases
 * the lock. Idempotent. */
void listener_close(struct listener *l);

#endif
