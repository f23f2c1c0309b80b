/* oracle.h — the forward engine's test oracle: what forward_run must answer, computed plainly.
 *
 * Same contract and summation order as forward_run (forward.h), computed on the calling thread
 * with one moek_ffn_run per expert batch, the weights read from `e`'s source (ALL_RESIDENT or
 * MMAP; with RESIDENCY each expert is acquired waiting). Independent of the scheduler's
 * planning code on purpose: ranks by counting, batches by a scan per expert. Test code only:
 * not in the shipped daemon. Takes the engine like forward_run; allocates per call.
 */
#ifndef MOE_TEST_FORWARD_ORACLE_H
#define MOE_TEST_FORWARD_ORACLE_H

#include "forward.h"

int forward_reference(struct forward_engine *e, const struct forward_request *req,
                      float *out_immediate, float *out_deferred, struct forward_result *res);

#endif /* MOE_TEST_FORWARD_ORACLE_H */
