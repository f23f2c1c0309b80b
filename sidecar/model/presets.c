/* presets.c — the model preset table (see presets.h). */
#include "presets.h"

#include <stdio.h>
#include <string.h>

const struct moe_model_preset moe_model_presets[] = {
    /* name, alias, arch, layers, experts, top-k, shared, hidden, expert ffn, dense ffn,
     * leading dense blocks — from each model's published config.json */
    {"qwen3-30b-a3b", NULL, MOE_ARCH_QWEN3MOE, 48, 128, 8, 0, 2048, 768, 6144, 0},
    {"mixtral-8x7b", "mixtral", MOE_ARCH_MIXTRAL, 32, 8, 2, 0, 4096, 14336, 14336, 0},
    {"deepseek-v3", NULL, MOE_ARCH_DEEPSEEK, 61, 256, 8, 1, 7168, 2048, 18432, 3},
    {"gpt-oss-20b", NULL, MOE_ARCH_GPT_OSS, 24, 32, 4, 0, 2880, 2880, 2880, 0},
    {"olmoe", NULL, MOE_ARCH_OLMOE, 16, 64, 8, 0, 2048, 1024, 1024, 0},
    {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

const struct moe_model_preset *moe_model_preset_find(const char *name)
{
	for (const struct moe_model_preset *p = moe_model_presets; p->name; p++)
		if (!strcmp(p->name, name) || (p->alias && !strcmp(p->alias, name)))
			return p;
	return NULL;
}

void moe_model_preset_names(char *buf, size_t len, const char *sep)
{
	size_t used = 0;
	if (len)
		buf[0] = '\0';
	for (const struct moe_model_preset *p = moe_model_presets; p->name && used < len; p++) {
		int n = snprintf(buf + used, len - used, "%s%s", p == moe_model_presets ? "" : sep,
		                 p->name);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}
