/* isa.c — CPU detection and the active kernel ops table.
 *
 * Owns: what this CPU can run (CPUID, and XGETBV for the register state the OS saves), the
 * table of instruction sets the kernels are built for (one row each: the enum, its name, the
 * CPU features it needs, its ops table and the forms it turns on when chosen), and which row
 * is active. Every other file asks here: ffn.c and interleave.c for the ops table, convert.c
 * whether the active ISA has F16C, the row quantizers whether the CPU has AVX2, x86_avx2.c
 * whose core it is. It also holds the forms in use (kernels_internal.h: variants of an ISA's
 * kernels with the same bits, such as AVX2's VNNI dots), the one switch tests flip to reach
 * each.
 *
 * Adding an ISA: an enum moek_isa value, its ops table, and a row in isa_table after the ones
 * it outperforms (MOEK_ISA_AUTO takes the last automatic row the CPU can run).
 *
 * Threading: the CPU's features are detected once, by whichever thread asks first (the same
 * answer from every thread, so a race only repeats the work). The active row is an atomic
 * pointer; forcing another one while kernels run is not supported (moe_kernels.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define ISA_X86 1
#endif
#if defined(ISA_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ISA_ARCH_PRCTL 1
#endif

/* ---- CPU detection ------------------------------------------------------------------------ */

#ifdef ISA_X86
/* XCR0: the register state the OS saves on a context switch (XGETBV, ECX = 0). */
static uint64_t xcr0(void)
{
	uint32_t lo, hi;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

/* Whether the kernel lets this process use AMX tile data (XFEATURE_XTILEDATA, 18). */
static bool amx_permitted(void)
{
#ifdef ISA_ARCH_PRCTL
	enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA = 18 };
	return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA) == 0;
#else
	return false;
#endif
}

static unsigned detect_cpu(void)
{
	unsigned a, b, c, d, bits = 0;
	if (!__get_cpuid(0, &a, &b, &c, &d))
		return 0;
	const unsigned max_leaf = a;
	/* "GenuineIntel" in EBX, EDX, ECX */
	if (b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu)
		bits |= MOEK_CPU_INTEL;
	if (!__get_cpuid(1, &a, &b, &c, &d))
		return bits;
	const bool osxsave = c & (1u << 27);
	const uint64_t xcr = osxsave ? xcr0() : 0;
	const bool ymm_state = (xcr & 0x6u) == 0x6u;    /* SSE + AVX */
	const bool zmm_state = (xcr & 0xe6u) == 0xe6u;  /* + opmask, ZMM0-15 upper, ZMM16-31 */
	const bool avx = ymm_state && (c & (1u << 28)); /* AVX, with the OS saving YMM */
	if (avx && (c & (1u << 12)))
		bits |= MOEK_CPU_FMA;
	if (avx && (c & (1u << 29)))
		bits |= MOEK_CPU_F16C;
	if (max_leaf < 7 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return bits;
	const unsigned b7 = b, c7 = c, d7 = d;
	if (avx && (b7 & (1u << 5)))
		bits |= MOEK_CPU_AVX2;
	/* The VNNI forms' subset (x86_avx2.c VNNI_CODE): F, BW, VL and VNNI, with ZMM state. */
	const bool avx512 =
	    avx && zmm_state && (b7 & (1u << 16)) && (b7 & (1u << 30)) && (b7 & (1u << 31));
	if (avx512 && (c7 & (1u << 11)))
		bits |= MOEK_CPU_AVX512_VNNI;
	if (avx512 && (c7 & (1u << 1)))
		bits |= MOEK_CPU_AVX512_VBMI;
	if (avx512 && (b7 & (1u << 17)))
		bits |= MOEK_CPU_AVX512;
	/* leaf 7 subleaf 1, EAX bit 5: AVX512-BF16 */
	if (avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)))
		bits |= MOEK_CPU_AVX512_BF16;
	/* AMX: BF16 (EDX 22), TILE (24), INT8 (25); XCR0 17-18: the OS saves tile config and
	 * data. Linux arms the tile data per process: ask for it once here (a process that is
	 * refused — seccomp, an old kernel — runs the other ISAs). */
	const unsigned amx = (1u << 22) | (1u << 24) | (1u << 25);
	if (avx512 && (d7 & amx) == amx && (xcr & (3ull << 17)) == (3ull << 17) && amx_permitted())
		bits |= MOEK_CPU_AMX;
	return bits;
}
#else
static unsigned detect_cpu(void)
{
	return 0;
}
#endif

enum { CPU_DETECTED = 1u << 31 };
static atomic_uint cpu_bits;

unsigned moek_cpu_features(void)
{
	unsigned bits = atomic_load_explicit(&cpu_bits, memory_order_relaxed);
	if (!(bits & CPU_DETECTED)) {
		bits = detect_cpu() | CPU_DETECTED;
		atomic_store_explicit(&cpu_bits, bits, memory_order_relaxed);
	}
	return bits & ~(unsigned)CPU_DETECTED;
}

const char *moek_cpu_feature_names(unsigned features, char *buf, size_t len)
{
	static const char *const names[] = {"avx2",       "fma",        "f16c",
	                                    "avx512vnni", "avx512vbmi", "intel",
	                                    "avx512",     "avx512bf16", "amx"};
	size_t at = 0;
	if (len)
		buf[0] = '\0';
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]) && len; i++) {
		if (!(features & (1u << i)))
			continue;
		const int w = snprintf(buf + at, len - at, "%s%s", at ? " " : "", names[i]);
		if (w < 0 || (size_t)w >= len - at)
			break;
		at += (size_t)w;
	}
	return buf;
}

/* ---- Forms ------------------------------------------------------------------------------- */

atomic_uint moek_isa_forms_on;

unsigned moek_isa_forms_available(void)
{
	const unsigned cpu = moek_cpu_features();
	if (!(cpu & MOEK_CPU_AVX512_VNNI))
		return 0;
	return MOEK_FORM_VNNI | (cpu & MOEK_CPU_AVX512_VBMI ? MOEK_FORM_VBMI : 0);
}

bool moek_set_isa_forms(unsigned forms)
{
	if (forms & ~moek_isa_forms_available())
		return false;
	if ((forms & MOEK_FORM_VBMI) && !(forms & MOEK_FORM_VNNI))
		return false;
	atomic_store_explicit(&moek_isa_forms_on, forms, memory_order_relaxed);
	return true;
}

/* ---- The baseline ISA --------------------------------------------------------------------- */

static float scalar_dot_f32(const float *a, const float *b, size_t k)
{
	float s = 0.0f;
	for (size_t i = 0; i < k; i++)
		s += a[i] * b[i];
	return s;
}

/* The reference: no dot products (rows are dequantized and multiplied in f32) and no prefill
 * tiles, so it stays row by row. */
const struct moek_isa_ops moek_scalar_ops = {
    .name = "scalar",
    .dot_f32 = scalar_dot_f32,
    .tile = NULL,
    .prefill = false,
};

/* ---- The table ---------------------------------------------------------------------------- */

#ifdef ISA_X86
/* AVX2 turns on the forms of its dots the CPU has and takes the group dots' prefetch default
 * for this core unless one was set; same bits either way. */
static void avx2_chosen(void)
{
	(void)moek_set_isa_forms(moek_isa_forms_available());
	unsigned near, gap;
	moek_avx2_group_prefetch(&near, &gap);
}

/* The wider tables start as copies of AVX2's, filled once. */
static pthread_once_t wide_once = PTHREAD_ONCE_INIT;
static void wide_build(void)
{
	moek_avx512_build();
	moek_amx_build();
}

static void wide_chosen(void)
{
	avx2_chosen();
	pthread_once(&wide_once, wide_build);
}
#endif

struct isa_row {
	enum moek_isa isa;
	const char *name;
	unsigned needs; /* MOEK_CPU_* bits, all required */
	const struct moek_isa_ops *ops;
	void (*chosen)(void); /* run each time the row is made active (NULL: nothing) */
	/* MOEK_ISA_AUTO may pick it: false for a path that no CPU of the project has run yet
	 * (forced by name only, and by the tests wherever the CPU has it) */
	bool automatic;
};

enum {
	NEEDS_AVX2 = MOEK_CPU_AVX2 | MOEK_CPU_FMA | MOEK_CPU_F16C,
	NEEDS_AVX512 = NEEDS_AVX2 | MOEK_CPU_AVX512 | MOEK_CPU_AVX512_VNNI | MOEK_CPU_AVX512_BF16,
	NEEDS_AMX = NEEDS_AVX512 | MOEK_CPU_AMX,
};

/* Least to most capable: MOEK_ISA_AUTO is the last automatic row the CPU can run. */
static const struct isa_row isa_table[] = {
    {MOEK_ISA_SCALAR, "scalar", 0, &moek_scalar_ops, NULL, true},
#ifdef ISA_X86
    {MOEK_ISA_AVX2, "avx2", NEEDS_AVX2, &moek_avx2_ops, avx2_chosen, true},
    {MOEK_ISA_AVX512, "avx512", NEEDS_AVX512, &moek_avx512_ops, wide_chosen, true},
    /* AMX's tiles match the model of the instructions bit for bit on a Sapphire Rapids CPU
     * (test_kernel_amx) and run bf16 prefill 3-4x avx512's (docs/performance.md) */
    {MOEK_ISA_AMX, "amx", NEEDS_AMX, &moek_amx_ops, wide_chosen, true},
#endif
};
enum { ISA_ROWS = sizeof(isa_table) / sizeof(isa_table[0]) };

static bool runs_here(const struct isa_row *row)
{
	return (moek_cpu_features() & row->needs) == row->needs;
}

/* The row for `isa` if this CPU can run it (MOEK_ISA_AUTO: the best one), else NULL. */
static const struct isa_row *runnable_row(enum moek_isa isa)
{
	if (isa == MOEK_ISA_AUTO) {
		for (size_t i = ISA_ROWS; i-- > 0;)
			if (isa_table[i].automatic && runs_here(&isa_table[i]))
				return &isa_table[i];
		return NULL;
	}
	for (size_t i = 0; i < ISA_ROWS; i++)
		if (isa_table[i].isa == isa)
			return runs_here(&isa_table[i]) ? &isa_table[i] : NULL;
	return NULL;
}

static _Atomic(const struct isa_row *) active_row;

static const struct isa_row *activate(const struct isa_row *row)
{
	if (row->chosen)
		row->chosen();
	atomic_store_explicit(&active_row, row, memory_order_release);
	return row;
}

/* The active row; on first use MOEK_ISA=<name> in the environment picks a row the CPU can run
 * (an unknown or unrunnable name: the best one). */
static const struct isa_row *current_row(void)
{
	const struct isa_row *row = atomic_load_explicit(&active_row, memory_order_acquire);
	if (row)
		return row;
	const char *env = getenv("MOEK_ISA"); /* once: later calls see active_row set */
	for (size_t i = 0; env && i < ISA_ROWS && !row; i++)
		if (strcmp(env, isa_table[i].name) == 0 && runs_here(&isa_table[i]))
			row = &isa_table[i];
	return activate(row ? row : runnable_row(MOEK_ISA_AUTO));
}

const struct moek_isa_ops *moek_isa_current(void)
{
	return current_row()->ops;
}

bool moek_isa_active_has(unsigned features)
{
	return (current_row()->needs & features) == features;
}

bool moek_isa_supported(enum moek_isa isa)
{
	return runnable_row(isa) != NULL;
}

int moek_set_isa(enum moek_isa isa)
{
	const struct isa_row *row = runnable_row(isa);
	if (!row)
		return -1;
	activate(row);
	return 0;
}

int moek_isa_parse(const char *name, enum moek_isa *out)
{
	static const char *const names[] = {
	    [MOEK_ISA_SCALAR] = "scalar",
	    [MOEK_ISA_AVX2] = "avx2",
	    [MOEK_ISA_AVX512] = "avx512",
	    [MOEK_ISA_AMX] = "amx",
	};
	for (size_t i = 1; name && i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i]) == 0) {
			*out = (enum moek_isa)i;
			return 0;
		}
	return -1;
}

const char *moek_isa_label(enum moek_isa isa)
{
	switch (isa) {
	case MOEK_ISA_SCALAR: return "scalar";
	case MOEK_ISA_AVX2: return "avx2";
	case MOEK_ISA_AVX512: return "avx512";
	case MOEK_ISA_AMX: return "amx";
	default: return NULL;
	}
}

unsigned moek_isa_missing(enum moek_isa isa)
{
	unsigned needs;
	switch (isa) {
	case MOEK_ISA_AUTO:
	case MOEK_ISA_SCALAR: needs = 0; break;
	case MOEK_ISA_AVX2: needs = NEEDS_AVX2; break;
	case MOEK_ISA_AVX512: needs = NEEDS_AVX512; break;
	default: needs = NEEDS_AMX; break;
	}
#ifndef ISA_X86
	if (isa != MOEK_ISA_AUTO && isa != MOEK_ISA_SCALAR)
		return needs ? needs : 1;
#endif
	return needs & ~moek_cpu_features();
}

int moek_isa_force(const char *name, char *why, size_t len)
{
	enum moek_isa isa;
	if (moek_isa_parse(name, &isa) != 0) {
		snprintf(why, len, "'%s': expected scalar, avx2, avx512 or amx", name ? name : "");
		return -1;
	}
	const unsigned missing = moek_isa_missing(isa);
	if (!missing && moek_set_isa(isa) == 0)
		return 0;
	char lacks[160], has[160];
	moek_cpu_feature_names(missing, lacks, sizeof(lacks));
	moek_cpu_feature_names(moek_cpu_features() & ~(unsigned)MOEK_CPU_INTEL, has, sizeof(has));
	snprintf(why, len, "%s: this CPU lacks %s (it has: %s)", name,
	         lacks[0] ? lacks : "what it needs", has[0] ? has : "none of the SIMD features");
	return -1;
}

const char *moek_isa_format_path(uint32_t format, char *buf, size_t len)
{
	const struct moek_isa_ops *ops = moek_isa_current();
	const struct moek_format_info *f = moek_format_lookup(format);
	const char *decode = ops->describe ? ops->describe(format, false) : ops->name;
	const char *prefill = ops->describe ? ops->describe(format, true) : ops->name;
	snprintf(buf, len, "%s: decode %s; prefill %s", f ? f->name : "?", decode, prefill);
	return buf;
}

enum moek_isa moek_isa_active(void)
{
	return current_row()->isa;
}

const char *moek_isa_name(void)
{
	return current_row()->name;
}
