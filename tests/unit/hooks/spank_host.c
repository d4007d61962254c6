/*
 * spank_host: loads malleable_spank.so as slurmstepd does (dlopen) and calls its
 * slurm_spank_init for one step, so that the plugin's decisions can be tested without Slurm.
 * It provides the few SPANK functions the plugin calls (slurmstepd's own exports).
 *
 *   spank_host PLUGIN.so JOB STEP [ARG=VALUE...]   (the plugstack.conf arguments)
 *
 * Exit 0: the plugin lets the step start; 1: it refuses; 2: the plugin cannot be loaded.
 * Its messages (slurm_error, slurm_debug) go to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <slurm/spank.h>

static uint32_t job_id, step_id;

const char *spank_strerror(spank_err_t err)
{
	(void)err;
	return "spank error";
}

int spank_remote(spank_t spank)
{
	(void)spank;
	return 1;
}

spank_context_t spank_context(void)
{
	return S_CTX_REMOTE;
}

spank_err_t spank_option_register(spank_t spank, struct spank_option *opt)
{
	(void)spank;
	(void)opt;
	return ESPANK_SUCCESS;
}

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *val,
				     int overwrite)
{
	(void)sp;
	(void)name;
	(void)val;
	(void)overwrite;
	return ESPANK_SUCCESS;
}

spank_err_t spank_get_item(spank_t spank, spank_item_t item, ...)
{
	(void)spank;
	va_list ap;
	va_start(ap, item);
	spank_err_t rc = ESPANK_SUCCESS;
	if (item == S_JOB_ID)
		*va_arg(ap, uint32_t *) = job_id;
	else if (item == S_JOB_STEPID)
		*va_arg(ap, uint32_t *) = step_id;
	else
		rc = ESPANK_BAD_ARG;
	va_end(ap);
	return rc;
}

static void say(const char *level, const char *format, va_list ap)
{
	fprintf(stderr, "%s: ", level);
	vfprintf(stderr, format, ap);
	fputc('\n', stderr);
}

void slurm_error(const char *format, ...)
{
	va_list ap;
	va_start(ap, format);
	say("error", format, ap);
	va_end(ap);
}

void slurm_debug(const char *format, ...)
{
	va_list ap;
	va_start(ap, format);
	say("debug", format, ap);
	va_end(ap);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: spank_host PLUGIN.so JOB STEP [ARG=VALUE...]\n");
		return 2;
	}
	job_id = (uint32_t)strtoul(argv[2], NULL, 10);
	step_id = (uint32_t)strtoul(argv[3], NULL, 10);
	void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (plugin == NULL) {
		fprintf(stderr, "%s\n", dlerror());
		return 2;
	}
	int (*init)(spank_t, int, char **) =
		(int (*)(spank_t, int, char **))dlsym(plugin, "slurm_spank_init");
	if (init == NULL) {
		fprintf(stderr, "no slurm_spank_init\n");
		return 2;
	}
	return init(NULL, argc - 4, argv + 4) == 0 ? 0 : 1;
}
