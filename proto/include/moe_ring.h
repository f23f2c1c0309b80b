/* moe_ring.h — single-producer/single-consumer ring indices and the sleep/wake protocol.
 *
 * Owns: the control block of a ring in shared memory and the two private cursors that drive
 * it. The entries themselves are a plain array beside the control block (moe_sqe or
 * moe_cqe), indexed by (index & (entries - 1)).
 *
 * Indices are free-running 32-bit counters (wrap-around is well defined: used = tail - head).
 * head is written only by the consumer and tail only by the producer, each on its own
 * 128-byte line (adjacent-line prefetch pairs 64-byte lines). Each side keeps a private copy
 * of its own index and a cached copy of the peer's, and touches the shared peer index only
 * when the cache says empty/full. Publication is a release store; observation an acquire
 * load, as in io_uring.
 *
 * The peer may be hostile: a peer index that is impossible (more than `entries` apart) is
 * reported as MOE_RING_BROKEN and the caller drops the peer. Own indices are never read
 * back from shared memory.
 *
 * Sleeping: the consumer spins briefly, then stores 1 to consumer_sleeping, issues a full
 * fence, re-checks the ring, and only then FUTEX_WAITs on the producer's TAIL word, expecting
 * the (empty-ring) value it just saw (shared futex). The producer, after publishing, issues a
 * full fence and calls FUTEX_WAKE on its tail only if it sees consumer_sleeping set. The two
 * fences (Dekker) guarantee that either the producer sees the announcement or the consumer's
 * re-check sees the new entries; waiting on the tail closes the remaining window, a wake
 * issued between the re-check and the FUTEX_WAIT: the tail has moved by then, so the wait
 * returns at once. (Waiting on consumer_sleeping itself, which the producer never changes,
 * would lose that wake-up.) Only the consumer writes consumer_sleeping; a peer that does is
 * broken, and the owner of the word may check it after waking.
 */
#ifndef MOE_RING_H
#define MOE_RING_H

#include <assert.h>
#include <errno.h>
#include <linux/futex.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MOE_RING_BROKEN (-1)

struct moe_ring_ctrl {
	alignas(128) _Atomic uint32_t head;              /* consumer's index */
	alignas(128) _Atomic uint32_t tail;              /* producer's index */
	alignas(128) _Atomic uint32_t consumer_sleeping; /* 1 while the consumer may sleep */
};
static_assert(sizeof(struct moe_ring_ctrl) == 384, "moe_ring_ctrl is ABI");

/* Producer's private cursor. */
struct moe_ring_prod {
	struct moe_ring_ctrl *ctrl;
	uint32_t tail;        /* next index to fill */
	uint32_t cached_head; /* last head observed */
	uint32_t entries;     /* power of two */
};

/* Consumer's private cursor. */
struct moe_ring_cons {
	struct moe_ring_ctrl *ctrl;
	uint32_t head;        /* next index to read */
	uint32_t cached_tail; /* last tail observed */
	uint32_t entries;
};

/* Initialises a control block (owner side, before the peer sees it). `start` is the initial
 * index of both head and tail; tests use values near UINT32_MAX to exercise wrap-around. */
static inline void moe_ring_ctrl_init(struct moe_ring_ctrl *ctrl, uint32_t start)
{
	atomic_store_explicit(&ctrl->head, start, memory_order_relaxed);
	atomic_store_explicit(&ctrl->tail, start, memory_order_relaxed);
	atomic_store_explicit(&ctrl->consumer_sleeping, 0, memory_order_relaxed);
}

/* Attaches a cursor to a control block whose indices are both `start` (the value passed to
 * moe_ring_ctrl_init, known privately to both sides). */
static inline void moe_ring_prod_attach(struct moe_ring_prod *p, struct moe_ring_ctrl *ctrl,
                                        uint32_t entries, uint32_t start)
{
	assert(entries && (entries & (entries - 1)) == 0);
	p->ctrl = ctrl;
	p->tail = start;
	p->cached_head = start;
	p->entries = entries;
}

static inline void moe_ring_cons_attach(struct moe_ring_cons *c, struct moe_ring_ctrl *ctrl,
                                        uint32_t entries, uint32_t start)
{
	assert(entries && (entries & (entries - 1)) == 0);
	c->ctrl = ctrl;
	c->head = start;
	c->cached_tail = start;
	c->entries = entries;
}

/* Free entries the producer may fill now (0 = full), or MOE_RING_BROKEN if the consumer's
 * head is impossible. Fill entries tail, tail+1, … then moe_ring_publish. */
static inline int64_t moe_ring_space(struct moe_ring_prod *p)
{
	uint32_t used = p->tail - p->cached_head;
	if (used < p->entries)
		return (int64_t)(p->entries - used);
	p->cached_head = atomic_load_explicit(&p->ctrl->head, memory_order_acquire);
	used = p->tail - p->cached_head;
	if (used > p->entries)
		return MOE_RING_BROKEN;
	return (int64_t)(p->entries - used);
}

/* Array position of the n-th entry after the producer's tail. */
static inline uint32_t moe_ring_prod_pos(const struct moe_ring_prod *p, uint32_t n)
{
	return (p->tail + n) & (p->entries - 1);
}

/* Makes n filled entries visible to the consumer. */
static inline void moe_ring_publish(struct moe_ring_prod *p, uint32_t n)
{
	p->tail += n;
	atomic_store_explicit(&p->ctrl->tail, p->tail, memory_order_release);
}

/* Entries ready for the consumer now (0 = empty), or MOE_RING_BROKEN if the producer's tail
 * is impossible. Read entries head, head+1, … then moe_ring_consume. */
static inline int64_t moe_ring_ready(struct moe_ring_cons *c)
{
	uint32_t avail = c->cached_tail - c->head;
	if (avail != 0 && avail <= c->entries)
		return avail;
	c->cached_tail = atomic_load_explicit(&c->ctrl->tail, memory_order_acquire);
	avail = c->cached_tail - c->head;
	if (avail > c->entries)
		return MOE_RING_BROKEN;
	return avail;
}

static inline uint32_t moe_ring_cons_pos(const struct moe_ring_cons *c, uint32_t n)
{
	return (c->head + n) & (c->entries - 1);
}

/* Returns n read entries to the producer. */
static inline void moe_ring_consume(struct moe_ring_cons *c, uint32_t n)
{
	c->head += n;
	atomic_store_explicit(&c->ctrl->head, c->head, memory_order_release);
}

/* ---- futex helpers (shared futexes: the word lives in a MAP_SHARED memfd) -------------- */

/* Waits while *word == expected, at most timeout_ns (< 0: forever). Returns 0 when woken or
 * the value differed, -ETIMEDOUT, or -EINTR. */
static inline int moe_futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
	struct timespec ts, *tsp = NULL;
	if (timeout_ns >= 0) {
		ts.tv_sec = (time_t)(timeout_ns / 1000000000);
		ts.tv_nsec = (long)(timeout_ns % 1000000000);
		tsp = &ts;
	}
	long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp, NULL, 0);
	if (rc == 0 || errno == EAGAIN)
		return 0;
	return -errno;
}

static inline void moe_futex_wake(_Atomic uint32_t *word, int n)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Producer side, after moe_ring_publish: wake the consumer if it announced sleep. */
static inline bool moe_ring_wake_consumer(struct moe_ring_prod *p)
{
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&p->ctrl->consumer_sleeping, memory_order_relaxed) != 0) {
		moe_futex_wake(&p->ctrl->tail, 1);
		return true;
	}
	return false;
}

/* Consumer side: announce sleep. Afterwards the caller MUST re-check moe_ring_ready; if it
 * is still 0, sleep with moe_ring_consumer_wait, and clear the word with
 * moe_ring_unannounce when it resumes. */
static inline void moe_ring_announce_sleep(struct moe_ring_cons *c)
{
	atomic_store_explicit(&c->ctrl->consumer_sleeping, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
}

/* The futex word and value a sleeping consumer waits on: the producer's tail, expected to
 * still equal the consumer's head (what the re-check saw: empty). For futex_waitv users. */
static inline _Atomic uint32_t *moe_ring_wait_word(struct moe_ring_cons *c)
{
	return &c->ctrl->tail;
}

static inline uint32_t moe_ring_wait_value(const struct moe_ring_cons *c)
{
	return c->head;
}

/* Sleeps until the producer publishes (or timeout_ns, < 0: forever). Call only after
 * moe_ring_announce_sleep and a re-check that found the ring empty. Returns 0 or
 * -ETIMEDOUT / -EINTR; a spurious return is possible, so re-check. */
static inline int moe_ring_consumer_wait(struct moe_ring_cons *c, int64_t timeout_ns)
{
	return moe_futex_wait(moe_ring_wait_word(c), moe_ring_wait_value(c), timeout_ns);
}

static inline void moe_ring_unannounce(struct moe_ring_cons *c)
{
	atomic_store_explicit(&c->ctrl->consumer_sleeping, 0, memory_order_relaxed);
}

/* A polite busy-wait step: lets the sibling hyperthread run, costs ~tens of cycles. */
static inline void moe_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	atomic_signal_fence(memory_order_seq_cst);
#endif
}

#endif /* MOE_RING_H */
