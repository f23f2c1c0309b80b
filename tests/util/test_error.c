/* test_error.c — the daemon's error record: status mapping from errno, prefixing that
 * truncates at the buffer's end, and NULL records accepted everywhere. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

Test(error, set_fills_status_and_message_and_returns_minus_one)
{
	struct sidecar_error err = {0};
	cr_assert_eq(error_set(&err, MOE_EIO, "%s: tensor %s: offset beyond end of file", "x.gguf",
	                       "blk.3.ffn_up_exps"),
	             -1);
	cr_assert_eq(err.status, MOE_EIO);
	cr_assert_str_eq(err.msg, "x.gguf: tensor blk.3.ffn_up_exps: offset beyond end of file");
}

Test(error, set_truncates_a_long_message_to_the_buffer)
{
	struct sidecar_error err;
	char big[2000];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	error_set(&err, MOE_EINVAL, "%s", big);
	cr_assert_eq(strlen(err.msg), sizeof(err.msg) - 1);
}

Test(error, null_record_is_accepted_by_every_function)
{
	errno = EIO;
	cr_assert_eq(error_set(NULL, MOE_EINVAL, "x %d", 1), -1);
	cr_assert_eq(error_set_errno(NULL, "open %s", "x"), -1);
	cr_assert_eq(error_prefix(NULL, "file"), -1);
	cr_assert_eq(errno, EIO);
}

static int status_for_errno(int e)
{
	struct sidecar_error err = {0};
	errno = e;
	cr_assert_eq(error_set_errno(&err, "open %s", "model.gguf"), -1);
	cr_assert_eq(errno, e, "errno changed");
	char want[256];
	snprintf(want, sizeof(want), "open model.gguf: %s", strerror(e));
	cr_assert_str_eq(err.msg, want);
	return err.status;
}

Test(error, set_errno_maps_the_status_and_appends_strerror)
{
	cr_assert_eq(status_for_errno(ENOMEM), MOE_ENOMEM);
	cr_assert_eq(status_for_errno(EIO), MOE_EIO);
	cr_assert_eq(status_for_errno(ENOENT), MOE_ESYS);
	cr_assert_eq(status_for_errno(EACCES), MOE_ESYS);
}

Test(error, set_errno_with_a_full_message_stays_terminated)
{
	struct sidecar_error err;
	char big[1000];
	memset(big, 'b', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	errno = EIO;
	error_set_errno(&err, "%s", big);
	cr_assert_eq(err.status, MOE_EIO);
	cr_assert_eq(strlen(err.msg), sizeof(err.msg) - 1);
	cr_assert_eq(err.msg[0], 'b');
}

Test(error, prefix_puts_the_prefix_in_front_and_keeps_the_status)
{
	struct sidecar_error err;
	error_set(&err, MOE_ENOMEM, "tensor %s: cannot allocate", "w");
	cr_assert_eq(error_prefix(&err, "model.gguf"), -1);
	cr_assert_str_eq(err.msg, "model.gguf: tensor w: cannot allocate");
	cr_assert_eq(err.status, MOE_ENOMEM);
}

Test(error, prefix_truncates_the_message_at_the_buffer_end)
{
	struct sidecar_error err;
	const size_t cap = sizeof(err.msg) - 1;
	char body[sizeof(err.msg)];
	memset(body, 'm', cap - 3);
	body[cap - 3] = '\0';
	error_set(&err, MOE_EINVAL, "%s", body); /* 3 bytes short of full */
	error_prefix(&err, "file");              /* "file: " adds 6: the last 3 'm's go */
	cr_assert_eq(strlen(err.msg), cap);
	cr_assert_eq(strncmp(err.msg, "file: mmm", 9), 0);
	cr_assert_eq(err.msg[cap - 1], 'm');
	cr_assert_eq(err.msg[cap], '\0');
}

Test(error, prefix_longer_than_the_buffer_is_cut_and_keeps_the_separator)
{
	struct sidecar_error err;
	error_set(&err, MOE_EINVAL, "msg");
	char prefix[2000];
	memset(prefix, 'p', sizeof(prefix) - 1);
	prefix[sizeof(prefix) - 1] = '\0';
	error_prefix(&err, prefix);
	const size_t cap = sizeof(err.msg) - 1;
	cr_assert_eq(strlen(err.msg), cap);
	cr_assert_eq(err.msg[cap - 2], ':');
	cr_assert_eq(err.msg[cap - 1], ' ');
}

Test(error, prefix_on_an_empty_message)
{
	struct sidecar_error err = {0};
	error_prefix(&err, "ctx");
	cr_assert_str_eq(err.msg, "ctx: ");
}

Test(error, copy_msg_truncates_and_accepts_null)
{
	struct sidecar_error err;
	error_set(&err, MOE_EINVAL, "policy 'x': unknown algorithm");
	char small[7];
	cr_assert_eq(error_copy_msg(small, sizeof(small), &err), -1);
	cr_assert_str_eq(small, "policy");
	cr_assert_eq(error_copy_msg(NULL, 0, &err), -1);
	cr_assert_eq(error_copy_msg(small, sizeof(small), NULL), -1);
	cr_assert_str_eq(small, "");
}

Test(error, status_from_errno_matches_set_errno)
{
	cr_assert_eq(error_status_from_errno(ENOMEM), MOE_ENOMEM);
	cr_assert_eq(error_status_from_errno(EIO), MOE_EIO);
	cr_assert_eq(error_status_from_errno(EPERM), MOE_ESYS);
}
