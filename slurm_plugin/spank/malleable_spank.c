/*
 * malleable_spank: lets a job step start in a job whose cores have grown.
 *
 * Why: when a step starts, slurmstepd (task/cgroup, cgroup v1) writes the job's cgroup folder
 * back to Slurm's allocation. While any step of the job holds more CPUs (the job grew) the
 * kernel refuses (EBUSY) and the step fails to launch. slurm_spank_init runs in the new step's
 * slurmstepd, as root, before that write (src/slurmd/slurmstepd/mgr.c, Slurm 22.05: spank_init
 * comes before task_g_pre_setuid). Here it runs the node's step-start hook, which brings the
 * job back to exactly its allocation under the node's lock and fences it there until this
 * slurmstepd has joined its step's cpuset; the node's agent then grows the job again, new step
 * included.
 *
 * plugstack.conf:  required /path/malleable_spank.so python=PYTHON config=AGENT_JSON [timeout=S]
 *
 * Fails closed: if the hook fails or does not answer in time, the step does not start (it
 * would fail on EBUSY anyway, or start on cores another job was lent).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(malleable, 1);

/* slurm.h's step ids with a name instead of a number. */
#define STEP_EXTERN 0xfffffffcu
#define STEP_BATCH 0xfffffffbu
#define STEP_INTERACTIVE 0xfffffffau

#define MAX_ARG 4096
#define ERR_BYTES 2048

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int arg_value(int ac, char **av, const char *key, const char **out)
{
	size_t n = strlen(key);
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], key, n) == 0 && av[i][n] == '=') {
			*out = av[i] + n + 1;
			return strlen(*out) > 0 && strlen(*out) < MAX_ARG;
		}
	}
	return 0;
}

static void step_folder(uint32_t step, char *buf, size_t len)
{
	if (step == STEP_BATCH)
		snprintf(buf, len, "step_batch");
	else if (step == STEP_INTERACTIVE)
		snprintf(buf, len, "step_interactive");
	else
		snprintf(buf, len, "step_%u", step);
}

/* Run argv with a clean environment; its stderr (bounded) goes to err. Returns the exit code,
 * or -1 when it could not run or did not finish within timeout_s (it is then killed). */
static int run_hook(char *const argv[], char *const envp[], double timeout_s,
		    char *err, size_t err_len)
{
	int fds[2];
	size_t used = 0;
	err[0] = '\0';
	if (pipe2(fds, O_CLOEXEC) < 0) {
		snprintf(err, err_len, "pipe: %s", strerror(errno));
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, err_len, "fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return -1;
	}
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDWR);
		if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 ||
		    dup2(fds[1], 2) < 0)
			_exit(126);
		/* slurmstepd's own sockets and files are not the hook's business. */
		long max = sysconf(_SC_OPEN_MAX);
		for (long fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
			close((int)fd);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execve(argv[0], argv, envp);
		_exit(127);
	}
	close(fds[1]);
	double deadline = now_s() + timeout_s;
	int status = 0, done = 0;
	while (!done) {
		struct pollfd p = {.fd = fds[0], .events = POLLIN};
		if (poll(&p, 1, 10) > 0) {
			char chunk[512];
			ssize_t n = read(fds[0], chunk, sizeof(chunk));
			if (n > 0 && used + 1 < err_len) {
				size_t take = (size_t)n < err_len - 1 - used ? (size_t)n : err_len - 1 - used;
				memcpy(err + used, chunk, take);
				used += take;
				err[used] = '\0';
			}
		}
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			done = 1;
		else if (w < 0 && errno != EINTR)
			break;
		else if (now_s() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			close(fds[0]);
			snprintf(err, err_len, "no answer in %.0f s", timeout_s);
			return -1;
		}
	}
	close(fds[0]);
	if (!done)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (!spank_remote(sp))
		return ESPANK_SUCCESS; /* srun, sbatch, salloc: nothing to do */
	uint32_t job = 0, step = 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS) {
		slurm_error("malleable: cannot read the job and step ids");
		return -1;
	}
	if (step == STEP_EXTERN)
		return ESPANK_SUCCESS; /* the job's first step: nothing has grown yet */
	const char *python = NULL, *config = NULL, *timeout = NULL;
	if (!arg_value(ac, av, "python", &python) || !arg_value(ac, av, "config", &config)) {
		slurm_error("malleable: plugstack.conf must give python=PATH config=PATH");
		return -1;
	}
	double timeout_s = arg_value(ac, av, "timeout", &timeout) ? atof(timeout) : 20.0;
	if (timeout_s <= 0)
		timeout_s = 20.0;
	const char *node = getenv("SLURMD_NODENAME"); /* slurmstepd sets it for itself */
	if (node == NULL || strlen(node) == 0 || strlen(node) > 200) {
		slurm_error("malleable: SLURMD_NODENAME is not set in slurmstepd");
		return -1;
	}
	char job_s[16], folder[32], pid_s[16], node_env[256];
	snprintf(job_s, sizeof(job_s), "%u", job);
	step_folder(step, folder, sizeof(folder));
	snprintf(pid_s, sizeof(pid_s), "%d", (int)getpid());
	snprintf(node_env, sizeof(node_env), "SLURMD_NODENAME=%s", node);
	char *const argv[] = {(char *)python, "-I", "-m", "slurm_plugin.coscheduler.hooks",
			      "step-start", "--config", (char *)config, "--job", job_s,
			      "--step", folder, "--stepd-pid", pid_s, NULL};
	char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", node_env, "LC_ALL=C.UTF-8",
			      NULL};
	char err[ERR_BYTES];
	double t0 = now_s();
	int rc = run_hook(argv, envp, timeout_s, err, sizeof(err));
	if (rc != 0) {
		slurm_error("malleable: job %u %s cannot start safely (hook exit %d): %s", job,
			    folder, rc, err);
		return -1;
	}
	slurm_debug("malleable: job %u %s fenced in %.0f ms", job, folder, (now_s() - t0) * 1000);
	return ESPANK_SUCCESS;
}
