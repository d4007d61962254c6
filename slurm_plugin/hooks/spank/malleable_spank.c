/*
 * malleable_spank: the `--malleable` option of sbatch, salloc and srun, and the step start in
 * a job whose cores may have grown.
 *
 * The option (allocator and local contexts): `--malleable=MIN[:MAX[:WEIGHT]]` or `off` is handed
 * to slurmctld as the job's SPANK environment entry MALLEABLE=VALUE, where job_submit.lua
 * checks it (one grammar, malleable_policy/request.py) and refuses a malformed one.
 *
 * The step start (remote context): when a step starts, slurmstepd (task/cgroup) writes the job's
 * cgroup folder back to Slurm's allocation. If the job holds more (it grew) the kernel refuses
 * (EBUSY, cgroup v1) and the step fails to launch; if it lent cores, they would be in two jobs.
 * slurm_spank_init runs in the new step's slurmstepd, as root, before that write
 * (src/slurmd/slurmstepd/mgr.c, Slurm 22.05: spank_init comes before task_g_pre_setuid).
 *   1. Fast, no process: under the node's lock, if the agent's last cycle left a gate file for
 *      the job (it holds exactly its allocation, nobody holds its cores), write a fence file
 *      (the agent then neither grows nor lends the job until this slurmstepd has joined its
 *      step's cpuset) and go on. Rigid and ungrown jobs take this path, and every job of a
 *      quiet node (its quiet file: no malleable job there, nothing lent).
 *   2. Else ask the node's running agent on its root-only socket to bring the job back to its
 *      allocation and fence it (one cycle in a warm process).
 *   3. Else (no agent, or no answer in time) run the Python step-start hook, which does the
 *      same in a process of its own.
 *
 * plugstack.conf:
 *   required /path/malleable_spank.so python=PYTHON config=AGENT_JSON state=STATE_DIR [timeout=S]
 *
 * Fails closed: if the agent refuses, or the hook fails or does not answer in time, the step
 * does not start (it would fail on EBUSY anyway, or start on cores another job was lent).
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
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <limits.h>
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
#define MAX_OPTION 128
#define LOCK_WAIT_S 2.0 /* a cycle holds the node's lock for milliseconds */
#define MAX_TIMEOUT_S 600.0

/* --malleable: the value as given, checked by job_submit.lua (one grammar, request.py). */
static char malleable_value[MAX_OPTION];
static int malleable_given;

static int opt_malleable(int val, const char *optarg, int remote)
{
	(void)val;
	if (remote)
		return 0; /* slurmstepd: the job's own business, already checked at submit */
	if (optarg == NULL || optarg[0] == '\0' || strlen(optarg) >= MAX_OPTION) {
		slurm_error("--malleable=MIN[:MAX[:WEIGHT]] (MAX a number or node) or --malleable=off");
		return -1;
	}
	snprintf(malleable_value, sizeof(malleable_value), "%s", optarg);
	malleable_given = 1;
	return 0;
}

/* Registered in slurm_spank_init, not through a static spank_options table: sbatch and salloc
 * (the allocator context) do not load a plugin's static table (plugstack.c, 22.05 to 24.11). */
static struct spank_option malleable_option = {
	"malleable", "MIN[:MAX[:WEIGHT]]|off",
	"Let the job's cores on each node grow and shrink while it runs: at least MIN, at most "
	"MAX (a number, or node: every core of the node), WEIGHT a share of idle cores (the site "
	"bounds it). off: rigid. Resize a running job with scontrol update JobId=J "
	"Comment=malleable:cpus=N.",
	1, 0, opt_malleable};

/* sbatch, salloc, srun: the option reaches slurmctld (job_submit.lua) in the job's SPANK
 * environment. In a step of an existing job it changes nothing. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp) || !malleable_given)
		return ESPANK_SUCCESS;
	spank_err_t err = spank_job_control_setenv(sp, "MALLEABLE", malleable_value, 1);
	if (err != ESPANK_SUCCESS && spank_context() == S_CTX_ALLOCATOR) {
		slurm_error("malleable: cannot pass --malleable to slurmctld: %s", spank_strerror(err));
		return -1;
	}
	return ESPANK_SUCCESS;
}

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
		/* slurmstepd's own sockets and files are not the hook's business: every descriptor
		 * above stderr, however high its number (close_range, Linux 5.9; else each one up
		 * to the process's limit). */
		if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
			long max = sysconf(_SC_OPEN_MAX);
			for (long fd = 3; fd < (max > 0 ? max : 1L << 20); fd++)
				close((int)fd);
		}
		/* Nor its signal handling: a signal slurmstepd ignores would stay ignored across
		 * exec, and a blocked one blocked. */
		for (int sig = 1; sig < NSIG; sig++)
			signal(sig, SIG_DFL);
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

/* A Slurm node name usable in a file name (malleable_protocol.layout.check_node_name). */
static int valid_node(const char *n)
{
	size_t len = strlen(n);
	if (len == 0 || len > 64 || strstr(n, "..") != NULL)
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = n[i];
		int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			 (i > 0 && (c == '.' || c == '_' || c == '-'));
		if (!ok)
			return 0;
	}
	return 1;
}

/* 1 if path is a folder of root's that nobody else may write: the only kind whose gate,
 * fence and socket files mean what they say (else the Python hook decides, from its config). */
static int roots_own_folder(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 &&
	       (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* The node's lock (the agent's and the hooks'), or -1 if not had within wait_s. */
static int lock_node(const char *state, const char *node, double wait_s)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof(path), "%s/agent-%s.lock", state, node) >= (int)sizeof(path))
		return -1;
	int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	double deadline = now_s() + wait_s;
	while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		if ((errno != EWOULDBLOCK && errno != EINTR) || now_s() > deadline) {
			close(fd);
			return -1;
		}
		usleep(2000);
	}
	return fd;
}

/* 1 if the agent's last cycle left a gate for the job: a regular file of root's. */
static int gated(const char *state, const char *node, uint32_t job)
{
	char path[PATH_MAX];
	struct stat st;
	if (snprintf(path, sizeof(path), "%s/gate-%s/%u", state, node, job) >= (int)sizeof(path))
		return 0;
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0;
}

/* 1 if the node is quiet (slurm_plugin/node/quiet.py: no malleable job, every job on exactly
 * its allocation, nothing lent; a regular file of root's): every job is as a gated one, and
 * stays so, since a cycle ends the quiet, under this lock, before it lends or grows anything.
 * A job whose Prolog skipped Python (on a quiet node) has no gate of the agent's yet. */
static int quiet(const char *state, const char *node)
{
	char path[PATH_MAX];
	struct stat st;
	if (snprintf(path, sizeof(path), "%s/quiet-%s", state, node) >= (int)sizeof(path))
		return 0;
	return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0;
}

/* The fence the agent's next cycle takes in: "<slurmstepd pid> <wall time>". 0 if written. */
static int write_fence(const char *state, const char *node, uint32_t job, const char *folder)
{
	char path[PATH_MAX], text[64];
	struct timespec ts;
	if (snprintf(path, sizeof(path), "%s/fences-%s/%u.%s", state, node, job, folder) >=
	    (int)sizeof(path))
		return -1;
	clock_gettime(CLOCK_REALTIME, &ts);
	int len = snprintf(text, sizeof(text), "%d %ld.%03ld\n", (int)getpid(), (long)ts.tv_sec,
			   ts.tv_nsec / 1000000);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	int ok = write(fd, text, len) == len;
	return (close(fd) == 0 && ok) ? 0 : -1;
}

/* Ask the node's agent (slurm_plugin/daemon/step_socket.py). 0: done, the step may start;
 * 1: refused (why in err); -1: no agent listening or no answer within wait_s. */
static int ask_agent(const char *state, const char *node, uint32_t job, const char *folder,
		     double wait_s, char *err, size_t err_len)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/agent-%s.sock", state, node) >=
	    (int)sizeof(addr.sun_path))
		return -1;
	/* Non-blocking: a listener whose queue is full answers EAGAIN at once instead of holding
	 * the step's start in connect() (then the hook decides). */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	char line[128], answer[1100];
	int len = snprintf(line, sizeof(line), "step-start %u %s %d\n", job, folder, (int)getpid());
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    send(fd, line, len, MSG_NOSIGNAL) != len) {
		close(fd);
		return -1;
	}
	size_t used = 0;
	double deadline = now_s() + wait_s;
	while (used < sizeof(answer) - 1 && memchr(answer, '\n', used) == NULL) {
		int left_ms = (int)((deadline - now_s()) * 1000);
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0)
			break;
		ssize_t n = read(fd, answer + used, sizeof(answer) - 1 - used);
		if (n <= 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	answer[used] = '\0';
	char *nl = strchr(answer, '\n');
	if (nl == NULL)
		return -1;
	*nl = '\0';
	if (strncmp(answer, "ok ", 3) == 0)
		return 0;
	snprintf(err, err_len, "%s", strncmp(answer, "refused ", 8) == 0 ? answer + 8 : answer);
	return 1;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_err_t reg = spank_option_register(sp, &malleable_option);
	if (reg != ESPANK_SUCCESS) {
		slurm_error("malleable: cannot register --malleable: %s", spank_strerror(reg));
		return -1;
	}
	if (!spank_remote(sp))
		return ESPANK_SUCCESS; /* srun, sbatch, salloc: only the option */
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
	if (!(timeout_s > 0 && timeout_s <= MAX_TIMEOUT_S)) /* nan and inf too */
		timeout_s = 20.0;
	const char *node = getenv("SLURMD_NODENAME"); /* slurmstepd sets it for itself */
	if (node == NULL || strlen(node) == 0 || strlen(node) > 200) {
		slurm_error("malleable: SLURMD_NODENAME is not set in slurmstepd");
		return -1;
	}
	char job_s[16], folder[32], pid_s[16], node_env[256];
	char err[ERR_BYTES];
	snprintf(job_s, sizeof(job_s), "%u", job);
	step_folder(step, folder, sizeof(folder));
	double t0 = now_s();
	const char *state = NULL;
	if (arg_value(ac, av, "state", &state) && valid_node(node) && roots_own_folder(state)) {
		int lock = lock_node(state, node, LOCK_WAIT_S);
		if (lock >= 0) {
			int fenced = (gated(state, node, job) || quiet(state, node)) &&
				     write_fence(state, node, job, folder) == 0;
			flock(lock, LOCK_UN);
			close(lock);
			if (fenced) {
				slurm_debug("malleable: job %u %s at its allocation, fenced in %.1f ms",
					    job, folder, (now_s() - t0) * 1000);
				return ESPANK_SUCCESS;
			}
		}
		int asked = ask_agent(state, node, job, folder, timeout_s / 2, err, sizeof(err));
		if (asked == 0) {
			slurm_debug("malleable: job %u %s brought back by the agent in %.0f ms", job,
				    folder, (now_s() - t0) * 1000);
			return ESPANK_SUCCESS;
		}
		if (asked == 1) {
			slurm_error("malleable: job %u %s cannot start safely (agent): %s", job, folder,
				    err);
			return -1;
		}
	}
	snprintf(pid_s, sizeof(pid_s), "%d", (int)getpid());
	snprintf(node_env, sizeof(node_env), "SLURMD_NODENAME=%s", node);
	char *const argv[] = {(char *)python, "-I", "-m", "slurm_plugin.hooks",
			      "step-start", "--config", (char *)config, "--job", job_s,
			      "--step", folder, "--stepd-pid", pid_s, NULL};
	char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", node_env, "LC_ALL=C.UTF-8",
			      NULL};
	int rc = run_hook(argv, envp, timeout_s, err, sizeof(err));
	if (rc != 0) {
		slurm_error("malleable: job %u %s cannot start safely (hook exit %d): %s", job,
			    folder, rc, err);
		return -1;
	}
	slurm_debug("malleable: job %u %s fenced in %.0f ms", job, folder, (now_s() - t0) * 1000);
	return ESPANK_SUCCESS;
}
