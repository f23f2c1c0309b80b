/* client.c — placeholder until libmoe_client lands (issue: foundation). */
#include "moe_client.h"

const char *moe_strerror(int status)
{
	return moe_status_str(status);
}
