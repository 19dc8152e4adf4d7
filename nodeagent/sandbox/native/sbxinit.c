/* paddock-sbxinit: one sandbox's builder and its PID 1, native (no interpreter in any
 * per-sandbox process). Two roles:
 *
 * builder (`paddock-sbxinit builder --sock N --agent-fd A --bpf-fd M`): spawned ahead by the
 * node holder (nodeagent/sandbox/zygote.py), holding nothing of any sandbox. It reads one create
 * request from the agent, then: unshares a mount namespace; forks a helper that makes the
 * sandbox's user namespace; unshares PID, IPC and UTS namespaces and forks the init; mounts the
 * root (a capped tmpfs, the overlay over the task's layers and the image with paths relative to
 * the sandbox dir, /dev, /dev/shm) and gives it to the init ("root": the init mounts /proc and pivots into it
 * meanwhile); maps the user namespace onto the sandbox's id slice; moves the init into the
 * cgroups the agent sent; gives the init its user namespace ("userns") and waits for
 * "ready"; reports to the holder (mount namespaces as fds) and to the agent (the init's socket
 * and pidfd); exits. A failure is reported to the agent with the call and errno text.
 * Layers ('y' records, bottom first: the node's extracted copies, on its tmpfs) are stacked
 * between the image and the upper dir through idmapped clones (open_tree, mount_setattr with
 * the sandbox's user namespace): a layer's root-owned files are the sandbox root's, so its
 * workload edits them (copy-up) as its own; with layers the user namespace is mapped before
 * the root is built.
 *
 * init (forked by the builder; or spawned by the Python builder of the fuse-overlayfs path as
 * `paddock-sbxinit --mon N --bpf-fd M --root DIR ...`, which maps it after "unshared"):
 *   1. keeps only its socket, the seccomp program and the egress socket; makes its network
 *      namespace and brings up lo; unshares a mount namespace, mounts /proc in the root
 *      (sensitive paths masked, hidden or read-only, as OCI runtimes do), pivots into it;
 *   2. enters its user namespace; unshares cgroup and UTS namespaces, sets the hostname,
 *      no_new_privs, non-dumpable, the rlimits it was given and the seccomp filter (raw BPF,
 *      exported once by the holder), starts the egress relay if asked, and says "ready"
 *      with its own mount namespace (an fd, for the holder to hold);
 *   3. runs one command per request until its socket closes: fork, setsid, stdio pipes, the
 *      OOM killer's first choice, cwd, uid, execve; output capped; past the deadline every
 *      other process of the sandbox is killed (kill(-1) from PID 1).
 * Wire format (nodeagent/sandbox/framing.py): a frame is a u32 big-endian length and records, each a
 * u8 tag, a u32 big-endian length and that many bytes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#define REQ_MAX_BYTES (16u << 20)
#define STDIN_MAX_BYTES (8u << 20)   /* nodeagent.sandbox.sbxinit.STDIN_MAX_BYTES checks it first */
#define STRAY_GRACE_MS 20
#define OOM_WORKLOAD 1000   /* oom_score_adj of the workload: the OOM killer's first choice */
#define OOM_SWEEP_MS 20     /* how often a running command's unprivileged processes are re-raised to it */
#define EGRESS_PORT 3128
#define EGRESS_MAX_CONNECTIONS 32
#define MAX_ARGS 4096
#define MAX_LAYERS 16
#define BUILD_FIELDS_MAX 96

static const char *PROC_MASKED[] = {"kcore", "keys", "timer_list", "timer_stats", "sched_debug",
                                    "latency_stats", "sysrq-trigger", "kallsyms", NULL};
static const char *PROC_HIDDEN_DIRS[] = {"acpi", "asound", "scsi", NULL};
static const char *PROC_READONLY[] = {"sys", "bus", "fs", "irq", NULL};

static int mon = -1;         /* the socket to the builder, then to the agent */
static int egress_fd = -1;   /* O_PATH fd of the node egress proxy's Unix socket, or -1 */

/* ------------------------------------------------------------------ frames and records */

struct buf { char *p; size_t len, cap; };

static void buf_put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) _exit(70);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void rec(struct buf *b, char tag, const void *data, size_t n) {
    uint32_t be = htonl((uint32_t)n);
    buf_put(b, &tag, 1);
    buf_put(b, &be, 4);
    buf_put(b, data, n);
}

static void rec_str(struct buf *b, char tag, const char *s) { rec(b, tag, s, strlen(s)); }

static void rec_num(struct buf *b, char tag, long long v) {
    char s[32];
    rec(b, tag, s, (size_t)snprintf(s, sizeof s, "%lld", v));
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Send one frame on `sock` in one message (the peer wakes once); the fds (if any) travel with it. */
static int send_frame(int sock, struct buf *b, const int *fds, int nfds) {
    uint32_t be = htonl((uint32_t)b->len);
    struct iovec iov[2] = {{&be, 4}, {b->p, b->len}};
    char ctl[CMSG_SPACE(4 * sizeof(int))] = {0};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = b->len ? 2 : 1};
    if (nfds > 0) {
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
    }
    ssize_t sent;
    do sent = sendmsg(sock, &mh, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    if (sent < 0) return -1;
    int rc = 0;
    if ((size_t)sent < 4) {   /* rare: the rest goes as a plain stream */
        rc = write_all(sock, (const char *)&be + sent, 4 - (size_t)sent);
        sent = 4;
    }
    size_t body_sent = (size_t)sent - 4;
    if (!rc && body_sent < b->len) rc = write_all(sock, b->p + body_sent, b->len - body_sent);
    b->len = 0;
    return rc;
}

static int read_all(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Read one frame from `sock` into *b, and up to `max_fds` fds sent with it (CLOEXEC);
 * -1 when the peer closed or sent more than REQ_MAX_BYTES. */
static int recv_frame(int sock, struct buf *b, int *fds, int *nfds, int max_fds) {
    uint32_t be;
    struct iovec iov = {&be, 4};
    char ctl[CMSG_SPACE(8 * sizeof(int))];
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    if (nfds) *nfds = 0;
    ssize_t got;
    do got = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC); while (got < 0 && errno == EINTR);
    if (got <= 0) return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (nfds && *nfds < max_fds) fds[(*nfds)++] = fd;
            else close(fd);
        }
    }
    if (got < 4 && read_all(sock, (char *)&be + got, 4 - (size_t)got)) return -1;
    size_t n = ntohl(be);
    if (n > REQ_MAX_BYTES) return -1;
    b->len = 0;
    if (n > b->cap) {
        char *p = realloc(b->p, n);
        if (!p) return -1;
        b->p = p;
        b->cap = n;
    }
    if (read_all(sock, b->p, n)) return -1;
    b->len = n;
    return 0;
}

/* Iterate records: returns the next offset, or 0 at the end, -1 on a malformed frame. */
static long next_rec(const struct buf *b, size_t off, char *tag, const char **val, size_t *n) {
    if (off >= b->len) return 0;
    if (b->len - off < 5) return -1;
    uint32_t be;
    memcpy(&be, b->p + off + 1, 4);
    size_t len = ntohl(be);
    if (len > b->len - off - 5) return -1;
    *tag = b->p[off];
    *val = b->p + off + 5;
    *n = len;
    return (long)(off + 5 + len);
}

/* ------------------------------------------------------------------ setup */

/* A stage timestamp for the agent (CLOCK_MONOTONIC: comparable across processes). */
static void mark(struct buf *b, const char *name) {
    char s[96];
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    rec(b, 'T', s, (size_t)snprintf(s, sizeof s, "%s=%lld.%09ld", name, (long long)t.tv_sec, t.tv_nsec));
}

static struct buf init_marks;   /* the init's own stage times, sent with "unshared" */

static int report_fd = -1;   /* where a failed setup call is reported: the builder, or the agent */
static const char *made_dir;   /* a builder's sandbox dir, removed if the create fails */

/* A failed create leaves nothing in the node's state dir (its mounts die with this namespace). */
static void builder_cleanup(void) {
    if (!made_dir) return;
    if (chdir("/")) {}
    umount2(made_dir, MNT_DETACH);
    rmdir(made_dir);
    made_dir = NULL;
}

static void stage(const char *name, int fd) {
    struct buf b = {0};
    rec_str(&b, 's', name);
    buf_put(&b, init_marks.p, init_marks.len);
    init_marks.len = 0;
    if (send_frame(mon, &b, &fd, fd >= 0)) _exit(1);
    free(b.p);
}

/* Report a failed setup call (with errno) to whoever waits for this process (the builder, or
 * for a builder the agent), who raises it as SandboxError; then exit. */
static void fail(const char *fmt, ...) {
    char msg[512];
    int err = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
    snprintf(msg + n, sizeof msg - (size_t)n, ": %s (errno %d)", strerror(err), err);
    struct buf b = {0};
    rec_str(&b, 's', "failed");
    rec_str(&b, 'm', msg);
    builder_cleanup();
    send_frame(report_fd, &b, NULL, 0);
    _exit(1);
}

/* Wait for stage `name` from the builder; returns the fd that came with it, or -1. */
static int expect(const char *name) {
    struct buf b = {0};
    char tag;
    const char *val;
    size_t n;
    int fd = -1, nfd = 0;
    if (recv_frame(mon, &b, &fd, &nfd, 1)) _exit(0);   /* the builder is gone: a failed create */
    if (next_rec(&b, 0, &tag, &val, &n) <= 0 || tag != 's' || n != strlen(name) || memcmp(val, name, n))
        _exit(1);
    free(b.p);
    return nfd ? fd : -1;
}

/* Close every fd from 3 up except those in keep[] (-1 entries ignored): a few close_range calls. */
static void close_all_but(int *keep, int n) {
    for (int i = 1; i < n; i++) {   /* sort (n is tiny) */
        for (int j = i; j > 0 && keep[j] < keep[j - 1]; j--) {
            int t = keep[j]; keep[j] = keep[j - 1]; keep[j - 1] = t;
        }
    }
    unsigned int lo = 3;
    for (int i = 0; i < n; i++) {
        if (keep[i] < (int)lo) continue;
        if ((unsigned int)keep[i] > lo) syscall(SYS_close_range, lo, (unsigned int)keep[i] - 1, 0);
        lo = (unsigned int)keep[i] + 1;
    }
    syscall(SYS_close_range, lo, ~0U, 0);
}

static void loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    strcpy(ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr)) fail("lo: SIOCGIFFLAGS");
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr)) fail("lo: SIOCSIFFLAGS");
    close(s);
}

static void must_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                       const char *data) {
    if (mount(src, dst, type, flags, data)) fail("mount %s on %s", src, dst);
}

static void enter_root(const char *root) {
    const unsigned long locked = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    char proc[2048], p[4096];
    struct stat st;
    if (strlen(root) > 1024) { errno = ENAMETOOLONG; fail("root %s", root); }
    if (unshare(CLONE_NEWNS)) fail("unshare(CLONE_NEWNS)");
    snprintf(proc, sizeof proc, "%s/proc", root);
    mark(&init_marks, "init_started");
    must_mount("proc", proc, "proc", locked, NULL);
    for (const char **name = PROC_MASKED; *name; name++) {
        snprintf(p, sizeof p, "%s/%s", proc, *name);
        if (lstat(p, &st) == 0) must_mount("/dev/null", p, NULL, MS_BIND, NULL);
    }
    for (const char **name = PROC_HIDDEN_DIRS; *name; name++) {
        snprintf(p, sizeof p, "%s/%s", proc, *name);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            must_mount("paddock-hidden", p, "tmpfs", locked | MS_RDONLY, "size=0,mode=0555");
    }
    for (const char **name = PROC_READONLY; *name; name++) {
        snprintf(p, sizeof p, "%s/%s", proc, *name);
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            must_mount(p, p, NULL, MS_BIND | MS_REC, NULL);
            must_mount(p, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | locked, NULL);
        }
    }
    mark(&init_marks, "init_proc_mounted");
    if (chdir(root)) fail("chdir %s", root);
    if (syscall(SYS_pivot_root, ".", ".")) fail("pivot_root %s", root);
    mark(&init_marks, "init_pivoted");
    if (umount2(".", MNT_DETACH)) fail("umount the old root");
    mark(&init_marks, "init_old_root_gone");
    if (chdir("/")) fail("chdir /");
}

static void set_sched(const char *spec) {
    /* "sched=batch", "nice=N", "cpus=A,B,...": the CPU cap held without a cgroup
     * (nodeagent/sandbox/usercaps.py); the init applies them to itself, every command inherits */
    const char *v = strchr(spec, '=') + 1;
    if (!strncmp(spec, "sched=", 6)) {
        struct sched_param sp = {0};
        if (strcmp(v, "batch") || sched_setscheduler(0, SCHED_BATCH, &sp)) fail("sched %s", spec);
    } else if (!strncmp(spec, "nice=", 5)) {
        if (setpriority(PRIO_PROCESS, 0, (int)strtol(v, NULL, 10))) fail("setpriority %s", spec);
    } else {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (char *end; *v; v = *end ? end + 1 : end) {
            long c = strtol(v, &end, 10);
            if (end == v || c < 0 || c >= CPU_SETSIZE) { errno = EINVAL; fail("cpus %s", spec); }
            CPU_SET((int)c, &set);
        }
        if (sched_setaffinity(0, sizeof set, &set)) fail("sched_setaffinity %s", spec);
    }
}

static void set_rlimit(const char *spec) {
    /* "NAME=VALUE", NAME in as, nproc, fsize, nofile, core; or a scheduling spec (set_sched) */
    if (!strncmp(spec, "sched=", 6) || !strncmp(spec, "nice=", 5) || !strncmp(spec, "cpus=", 5)) {
        set_sched(spec);
        return;
    }
    static const struct { const char *name; int res; } names[] = {
        {"as", RLIMIT_AS}, {"nproc", RLIMIT_NPROC}, {"fsize", RLIMIT_FSIZE},
        {"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE}};
    const char *eq = strchr(spec, '=');
    for (size_t i = 0; eq && i < sizeof names / sizeof names[0]; i++) {
        if (strlen(names[i].name) == (size_t)(eq - spec) && !strncmp(spec, names[i].name, (size_t)(eq - spec))) {
            rlim_t v = strtoull(eq + 1, NULL, 10);
            struct rlimit rl = {v, v};
            if (setrlimit(names[i].res, &rl)) fail("setrlimit %s", spec);
            return;
        }
    }
    errno = EINVAL;
    fail("rlimit %s", spec);
}

static void install_seccomp(int fd) {
    static char prog[1 << 16];
    ssize_t n = pread(fd, prog, sizeof prog, 0);
    if (n < 0 || n % 8 || n == sizeof prog) fail("reading the seccomp program");
    close(fd);
    if (n == 0) return;
    struct sock_fprog fprog = {(unsigned short)(n / 8), (struct sock_filter *)prog};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0)) fail("prctl(PR_SET_SECCOMP)");
}

/* ------------------------------------------------------------------ egress relay */

static int egress_slots = EGRESS_MAX_CONNECTIONS;
static pthread_mutex_t egress_lock = PTHREAD_MUTEX_INITIALIZER;

static void *relay_one(void *arg) {
    int conn = (int)(intptr_t)arg, up = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d", egress_fd);
    if (up >= 0 && connect(up, (struct sockaddr *)&sa, sizeof sa) == 0) {
        int fd[2] = {conn, up};    /* p[i].fd goes -1 when direction i ends; fd[i] stays for the other way */
        struct pollfd p[2] = {{conn, POLLIN, 0}, {up, POLLIN, 0}};
        int open_dirs = 2;
        char chunk[65536];
        while (open_dirs > 0 && poll(p, 2, -1) > 0) {
            for (int i = 0; i < 2; i++) {
                if (!p[i].revents) continue;
                ssize_t r = read(fd[i], chunk, sizeof chunk);
                if (r <= 0) {   /* that direction is done: pass the end on, keep the other one */
                    shutdown(fd[1 - i], SHUT_WR);
                    p[i].fd = -1;
                    open_dirs--;
                } else if (send(fd[1 - i], chunk, (size_t)r, MSG_NOSIGNAL) != r) {
                    open_dirs = 0;
                }
            }
        }
    }
    if (up >= 0) close(up);
    close(conn);
    pthread_mutex_lock(&egress_lock);
    egress_slots++;
    pthread_mutex_unlock(&egress_lock);
    return NULL;
}

static void *relay_accept(void *arg) {
    int lst = (int)(intptr_t)arg;
    for (;;) {
        int conn = accept4(lst, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) continue;
        pthread_mutex_lock(&egress_lock);
        int ok = egress_slots > 0;
        egress_slots -= ok;
        pthread_mutex_unlock(&egress_lock);
        pthread_t t;
        if (!ok || pthread_create(&t, NULL, relay_one, (void *)(intptr_t)conn)) {
            close(conn);   /* over the connection cap: refuse, do not queue */
            if (ok) { pthread_mutex_lock(&egress_lock); egress_slots++; pthread_mutex_unlock(&egress_lock); }
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

static void start_egress_relay(void) {
    int one = 1, lst = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(EGRESS_PORT),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (lst < 0) fail("egress relay: socket");
    setsockopt(lst, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lst, (struct sockaddr *)&sa, sizeof sa)) fail("egress relay: bind 127.0.0.1:%d", EGRESS_PORT);
    if (listen(lst, EGRESS_MAX_CONNECTIONS)) fail("egress relay: listen");
    pthread_t t;
    errno = pthread_create(&t, NULL, relay_accept, (void *)(intptr_t)lst);
    if (errno) fail("egress relay: thread");
    pthread_detach(t);
}

/* ------------------------------------------------------------------ commands */

struct cmd {
    char *argv[MAX_ARGS + 1];
    char *env[MAX_ARGS + 1];
    const char *cwd;
    const char *stdin_data;
    size_t stdin_len, cap;
    long long timeout_ms;
    long uid;   /* -1: the sandbox's root */
    int oom_adj;   /* the command's oom_score_adj (0..1000): OOM_WORKLOAD unless asked lower */
};

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Every other process of the sandbox dies (this is its PID 1); all are reaped. */
static void kill_all_but_me(void) {
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {}
}

/* Reap every exited child; return 1 and set *status once `pid` is among them. */
static int reap(pid_t pid, int *status) {
    int found = 0, st;
    pid_t got;
    while ((got = waitpid(-1, &st, WNOHANG)) > 0) {
        if (got == pid) { *status = st; found = 1; }
    }
    return found;
}

/* Parse a request frame into `c` (strings NUL-terminated in place: a frame is copied first). */
static const char *parse_cmd(struct buf *b, struct cmd *c, struct buf *strings) {
    size_t na = 0, ne = 0;
    long off = 0;
    char tag;
    const char *val;
    size_t n;
    memset(c, 0, sizeof *c);
    c->cwd = "/work";
    c->cap = 65536;
    c->timeout_ms = 30000;
    c->uid = -1;
    c->oom_adj = OOM_WORKLOAD;
    strings->len = 0;
    /* Every value copied NUL-terminated: two passes, offsets first (realloc moves the buffer). */
    size_t offs[2 * MAX_ARGS + 8];
    char tags[2 * MAX_ARGS + 8];
    size_t nrec = 0;
    while ((off = next_rec(b, (size_t)off, &tag, &val, &n)) > 0) {
        if (nrec == sizeof tags) return "too many fields";
        tags[nrec] = tag;
        offs[nrec++] = strings->len;
        if (tag == 'i') {
            c->stdin_data = val;
            c->stdin_len = n;
        }
        buf_put(strings, val, n);
        buf_put(strings, "", 1);
    }
    if (off < 0) return "malformed request";
    if (c->stdin_len > STDIN_MAX_BYTES) return "stdin is larger than the cap of 8 MiB";
    for (size_t i = 0; i < nrec; i++) {
        char *s = strings->p + offs[i];
        switch (tags[i]) {
        case 'a': if (na == MAX_ARGS) return "too many arguments"; c->argv[na++] = s; break;
        case 'e': if (ne == MAX_ARGS) return "too many environment entries"; c->env[ne++] = s; break;
        case 'c': c->cwd = s; break;
        case 't': c->timeout_ms = strtoll(s, NULL, 10); break;
        case 'o': c->cap = strtoull(s, NULL, 10); break;
        case 'u': c->uid = strtol(s, NULL, 10); break;
        case 'O': c->oom_adj = (int)strtol(s, NULL, 10);
                  if (c->oom_adj < 0 || c->oom_adj > OOM_WORKLOAD) return "oom_score_adj must be in [0, 1000]";
                  break;
        case 'i': break;
        default: return "unknown field";
        }
    }
    if (na == 0) return "argv must be a non-empty list of strings";
    return NULL;
}

/* In the forked child (its own copy of the init's memory: a vfork child shared the init's mm,
 * and the dumpable flag it set there made the init's own memory writable through /proc/1/mem):
 * never returns. */
static void exec_child(struct cmd *c, int in_r, int out_w, int err_w) {
    char msg[600];
    setsid();
    signal(SIGPIPE, SIG_DFL);
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);   /* this copy's /proc/self is its own (the init stays not dumpable) */
    char adj[16];
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {   /* under memory pressure the workload dies, never the sandbox init */
        int n = snprintf(adj, sizeof adj, "%d", c->oom_adj);
        if (write(fd, adj, (size_t)n) < 0) {}
        close(fd);
    }
    /* The command and all it starts lose CAP_SYS_PTRACE, which would reach a non-dumpable
     * process of the same user namespace (the init). */
    if (prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0)) {
        static const char no_drop[] = "paddock: cannot drop CAP_SYS_PTRACE\n";
        if (write(err_w, no_drop, sizeof no_drop - 1) < 0) {}
        _exit(126);
    }
    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(126);
    syscall(SYS_close_range, 3, ~0U, 0);
    const char *what = "chdir";
    if (chdir(c->cwd) == 0) {
        what = "setuid";
        /* Raw calls: glibc's setxid would try to signal the init's threads (the egress relay),
         * which this child does not have. */
        if (c->uid < 0 || (syscall(SYS_setresgid, c->uid, c->uid, c->uid) == 0 &&
                           syscall(SYS_setresuid, c->uid, c->uid, c->uid) == 0)) {
            extern char **environ;
            environ = c->env;   /* execvp searches the command's PATH */
            what = "execve";
            execvp(c->argv[0], c->argv);
        }
    }
    int err = errno;
    int n = snprintf(msg, sizeof msg, "paddock: cannot run %s (%s): %s\n", c->argv[0], what, strerror(err));
    if (write(2, msg, (size_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1)) < 0) {}
    _exit(err == ENOENT ? 127 : 126);
}

/* Every process of an unprivileged uid (uid != 0 in the sandbox: code under test that a grader
 * started after dropping privileges) back to OOM_WORKLOAD. A process may lower its own
 * oom_score_adj to the minimum it inherited (0, as unprivileged as the node agent), not below:
 * so a grader asked to run at 0 stays below its workload only if the workload is raised again,
 * which this does every OOM_SWEEP_MS while a command runs. */
static void sweep_oom(void) {
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *e;
    char path[64], line[256];
    while ((e = readdir(d))) {
        long pid = strtol(e->d_name, NULL, 10);
        if (pid <= 1) continue;   /* not a process, or this init */
        snprintf(path, sizeof path, "/proc/%ld/status", pid);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        long uid = 0;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "Uid:", 4) == 0) { uid = strtol(line + 4, NULL, 10); break; }
        }
        fclose(f);
        if (uid == 0) continue;
        snprintf(path, sizeof path, "/proc/%ld/oom_score_adj", pid);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) continue;
        char cur[16] = {0};
        if (read(fd, cur, sizeof cur - 1) > 0 && atoi(cur) != OOM_WORKLOAD) {
            if (pwrite(fd, "1000", 4, 0) < 0) {}
        }
        close(fd);
    }
    closedir(d);
}

static void run_command(struct cmd *c, struct buf *reply) {
    int in[2], out[2], err[2];
    double t0 = now_ms(), deadline = t0 + (double)c->timeout_ms;
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC)) {
        rec_num(reply, 'x', 126);
        rec_str(reply, '2', "paddock: cannot make pipes\n");
        return;
    }
    pid_t pid = fork();   /* a copy of the init's (small) memory, never the init's own mm */
    if (pid < 0 && errno == EAGAIN) {   /* a fork bomb holds every PID: reclaim, try once more */
        kill_all_but_me();
        pid = fork();
    }
    if (pid == 0) exec_child(c, in[0], out[1], err[1]);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        char m[200];
        snprintf(m, sizeof m, "paddock: cannot run %s: fork: %s\n", c->argv[0], strerror(errno));
        close(in[1]); close(out[0]); close(err[0]);
        rec_num(reply, 'x', 126);
        rec_str(reply, '2', m);
        return;
    }
    /* stdin is fed from the poll loop as the pipe drains (all of it: parse_cmd refused more
     * than STDIN_MAX_BYTES), then closed; a command that exits or closes its stdin first ends
     * the feed (EPIPE: SIGPIPE is ignored here). */
    size_t fed = 0;
    if (c->stdin_len) fcntl(in[1], F_SETFL, O_NONBLOCK);
    else { close(in[1]); in[1] = -1; }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p[4] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {pidfd, POLLIN, 0}, {in[1], POLLOUT, 0}};
    struct buf bufs[2] = {{0}, {0}};
    int status = 0, exited = 0, open_fds = 2, timed_out = 0, truncated = 0;
    char chunk[65536];
    double next_sweep = c->oom_adj < OOM_WORKLOAD ? t0 : deadline + 1;
    while (open_fds || !exited) {
        double left = deadline - now_ms();
        if (left <= 0) { timed_out = 1; break; }
        if (now_ms() >= next_sweep) {
            sweep_oom();
            next_sweep = now_ms() + OOM_SWEEP_MS;
        }
        int wait_ms = (int)left + 1;
        if (exited && wait_ms > STRAY_GRACE_MS) wait_ms = STRAY_GRACE_MS;
        if (next_sweep <= deadline && wait_ms > OOM_SWEEP_MS) wait_ms = OOM_SWEEP_MS;
        int ready = poll(p, 4, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0 && exited) break;   /* strays keep the pipes open: stop reading */
        if (p[2].revents) {
            exited = reap(pid, &status);
            if (exited) p[2].fd = -1;
        }
        if (p[3].revents) {
            ssize_t w = (p[3].revents & POLLOUT) ? write(in[1], c->stdin_data + fed, c->stdin_len - fed) : -1;
            if (w > 0) fed += (size_t)w;
            if (fed >= c->stdin_len || (w < 0 && errno != EAGAIN && errno != EINTR)) {
                close(in[1]);
                in[1] = p[3].fd = -1;
            }
        }
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents) continue;
            ssize_t r = read(p[i].fd, chunk, sizeof chunk);
            if (r <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
                continue;
            }
            size_t room = c->cap > bufs[i].len ? c->cap - bufs[i].len : 0;
            if ((size_t)r > room) truncated = 1;
            buf_put(&bufs[i], chunk, (size_t)r < room ? (size_t)r : room);
        }
    }
    for (int i = 0; i < 2; i++) if (p[i].fd >= 0) close(p[i].fd);
    if (in[1] >= 0) close(in[1]);
    if (pidfd >= 0) close(pidfd);
    if (timed_out) {
        kill_all_but_me();
    } else if (!exited) {
        waitpid(pid, &status, 0);
    }
    reap(pid, &status);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    rec_num(reply, 'x', timed_out ? 124 : code);
    rec_num(reply, 'T', timed_out);
    rec_num(reply, 'r', truncated);
    rec_num(reply, 'w', (long long)((now_ms() - t0) * 1e3));   /* microseconds */
    rec(reply, '1', bufs[0].p ? bufs[0].p : "", bufs[0].len);
    rec(reply, '2', bufs[1].p ? bufs[1].p : "", bufs[1].len);
    free(bufs[0].p);
    free(bufs[1].p);
}

static void serve(void) {
    struct buf req = {0}, strings = {0}, reply = {0};
    struct cmd c;
    for (;;) {
        if (recv_frame(mon, &req, NULL, NULL, 0)) _exit(0);   /* the agent is gone */
        int status;
        reap(-2, &status);   /* orphans of earlier commands */
        const char *bad = parse_cmd(&req, &c, &strings);
        if (bad) {
            char m[200];
            snprintf(m, sizeof m, "paddock: %s\n", bad);
            rec_num(&reply, 'x', 126);
            rec_str(&reply, '2', m);
        } else {
            run_command(&c, &reply);
        }
        if (send_frame(mon, &reply, NULL, 0)) _exit(0);
    }
}

/* ------------------------------------------------------------------ the init */

#define MAX_RLIMITS 16

struct init_cfg {
    const char *root, *hostname;
    const char *rlimits[MAX_RLIMITS];
    int nrl, bpf_fd;
    int forked;   /* by the native builder: makes its own network namespace while the root is built */
};

/* PID 1 of the sandbox: `mon` is its socket to the builder (then to the agent). */
static void init_main(struct init_cfg *cfg) {
    report_fd = mon;
    /* Only what it was given: never another sandbox's fd that a builder held. */
    int keep[3] = {mon, cfg->bpf_fd, egress_fd};
    close_all_but(keep, 3);
    int userns = -1;
    if (cfg->forked) {
        if (unshare(CLONE_NEWNET)) fail("unshare(CLONE_NEWNET)");
        loopback_up();
        /* Meanwhile the builder mounts the root (in the namespace we share): "root". */
        expect("root");
        /* Meanwhile the builder maps a user namespace made for us and moves us into our
         * cgroups: "userns" brings that namespace. */
        enter_root(cfg->root);
        userns = expect("userns");
        if (userns < 0) {
            errno = EBADF;
            fail("no user namespace came with \"userns\"");
        }
    } else {
        loopback_up();
        enter_root(cfg->root);
    }
    if (userns >= 0) {
        if (setns(userns, CLONE_NEWUSER)) fail("setns into the sandbox user namespace");
        close(userns);
    } else {   /* spawned by the Python builder: it maps us once we have unshared */
        if (unshare(CLONE_NEWUSER)) fail("unshare(CLONE_NEWUSER)");
        stage("unshared", -1);
        expect("mapped");
    }
    if (setresgid(0, 0, 0) || setresuid(0, 0, 0)) fail("becoming root of the sandbox user namespace");
    /* The builder moved this process into its cgroups already: they become its root. */
    if (unshare(CLONE_NEWCGROUP)) fail("unshare(CLONE_NEWCGROUP)");
    /* A UTS namespace of its own user namespace; seccomp then denies sethostname. */
    if (unshare(CLONE_NEWUTS)) fail("unshare(CLONE_NEWUTS)");
    if (sethostname(cfg->hostname, strlen(cfg->hostname))) fail("sethostname %s", cfg->hostname);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("prctl(PR_SET_NO_NEW_PRIVS)");
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) fail("prctl(PR_SET_DUMPABLE)");
    for (int i = 0; i < cfg->nrl; i++) set_rlimit(cfg->rlimits[i]);
    install_seccomp(cfg->bpf_fd);   /* before any thread: every thread and command inherits it */
    if (egress_fd >= 0) start_egress_relay();
    /* Its own mount namespace, for the node holder to hold: torn down when the holder lets go
     * of it after a destroy, not in this process's exit, which destroy waits for. */
    int ns = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail("open /proc/self/ns/mnt");
    stage("ready", ns);
    close(ns);
    serve();
}

/* ------------------------------------------------------------------ the builder */

struct build_req {
    const char *id, *sbx, *lower, *dev, *tmpfs, *egress;
    const char *layers[MAX_LAYERS];   /* bottom first */
    int nlayers;
    long base, size;
    struct init_cfg init;
    char lowerdir[2048];   /* the overlay's lowerdir: layers (top first), then the image */
};

static const char *parse_build(struct buf *b, struct build_req *r, struct buf *strings) {
    size_t offs[BUILD_FIELDS_MAX];
    char tags[BUILD_FIELDS_MAX];
    size_t nrec = 0;
    long off = 0;
    char tag;
    const char *val;
    size_t n;
    memset(r, 0, sizeof *r);
    r->init.hostname = "sandbox";
    while ((off = next_rec(b, (size_t)off, &tag, &val, &n)) > 0) {
        if (nrec == sizeof tags) return "too many fields";
        tags[nrec] = tag;
        offs[nrec++] = strings->len;
        buf_put(strings, val, n);
        buf_put(strings, "", 1);
    }
    if (off < 0) return "malformed request";
    for (size_t i = 0; i < nrec; i++) {
        const char *v = strings->p + offs[i];
        switch (tags[i]) {
        case 'i': r->id = v; break;
        case 'd': r->sbx = v; break;
        case 'l': r->lower = v; break;
        case 'v': r->dev = v; break;
        case 'z': r->tmpfs = v; break;
        case 'g': r->egress = v; break;
        case 'b': r->base = strtol(v, NULL, 10); break;
        case 'n': r->size = strtol(v, NULL, 10); break;
        case 'h': r->init.hostname = v; break;
        case 'R': if (r->init.nrl == MAX_RLIMITS) return "too many rlimits"; r->init.rlimits[r->init.nrl++] = v; break;
        case 'y': if (r->nlayers == MAX_LAYERS) return "too many layers"; r->layers[r->nlayers++] = v; break;
        default: return "unknown field";
        }
    }
    if (!r->id || !r->sbx || !r->lower || !r->dev || !r->tmpfs || r->size <= 0) return "a field is missing";
    return NULL;
}

static void write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, data, strlen(data)) != (ssize_t)strlen(data)) fail("writing %s", path);
    close(fd);
}

#ifndef MOUNT_ATTR_IDMAP
#define MOUNT_ATTR_IDMAP 0x00100000
#endif
struct paddock_mount_attr { unsigned long long attr_set, attr_clr, propagation, userns_fd; };

/* Layer i at sbx/y<i> (cwd: sbx): an idmapped, read-only clone of the node's copy, whose
 * owners are seen through the sandbox's user namespace (node root -> sandbox root). */
static void mount_layer(const char *src, int i, int userns) {
    char name[16];
    snprintf(name, sizeof name, "y%d", i);
    if (mkdir(name, 0755)) fail("mkdir %s", name);
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (fd < 0) fail("open_tree %s", src);
    struct paddock_mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
                                      | MOUNT_ATTR_NODEV, .userns_fd = (unsigned long long)userns};
    if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &attr, sizeof attr))
        fail("mount_setattr(idmap) %s", src);
    if (syscall(SYS_move_mount, fd, "", AT_FDCWD, name, MOVE_MOUNT_F_EMPTY_PATH)) fail("move_mount %s", name);
    close(fd);
}

/* The overlay's lowerdir: y<n-1>:...:y0:<image> (relative to sbx). */
static void lowerdir_of(struct build_req *r) {
    size_t off = 0;
    r->lowerdir[0] = 0;
    for (int i = r->nlayers - 1; i >= 0; i--)
        off += (size_t)snprintf(r->lowerdir + off, sizeof r->lowerdir - off, "y%d:", i);
    if (off + strlen(r->lower) + 1 > sizeof r->lowerdir) { errno = ENAMETOOLONG; fail("lowerdir"); }
    strcpy(r->lowerdir + off, r->lower);
}

/* The sandbox's root at sbx/root: a capped tmpfs, the overlay over the layers and the image
 * (mounted from inside sbx with relative paths: its options name no host path), /dev and
 * /dev/shm. `userns`: the sandbox's mapped user namespace (needed with layers). */
static void build_root(struct build_req *r, int userns) {
    const unsigned long flags = MS_NOSUID | MS_NODEV;
    char opts[4096];
    if (mkdir(r->sbx, 0755)) fail("mkdir %s", r->sbx);
    made_dir = r->sbx;
    snprintf(opts, sizeof opts, "mode=0755,%s", r->tmpfs);
    must_mount("paddock-sbx", r->sbx, "tmpfs", flags, opts);
    if (chdir(r->sbx)) fail("chdir %s", r->sbx);
    if (mkdir("upper", 0755) || mkdir("work", 0755) || mkdir("root", 0755)) fail("mkdir in %s", r->sbx);
    /* The sandbox's /work, owned by its root, made in the upper layer before the overlay is
     * mounted: a chown through the overlay would copy the image's /work up (a dozen FUSE
     * requests). It merges with the image's /work like a copied-up directory. */
    if (mkdir("upper/work", 0755) || chown("upper/work", (uid_t)r->base, (gid_t)r->base)
        || chmod("upper/work", 0755))
        fail("making /work in %s", r->sbx);
    for (int i = 0; i < r->nlayers; i++) mount_layer(r->layers[i], i, userns);
    lowerdir_of(r);
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=upper,workdir=work,userxattr", r->lowerdir);
    must_mount("paddock-overlay", "root", "overlay", flags, opts);
    static const char *dirs[] = {"root/work", "root/proc", "root/dev", "root/tmp", NULL};
    for (const char **d = dirs; *d; d++) {
        if (mkdir(*d, 0755) && errno != EEXIST) fail("mkdir %s", *d);
    }
    struct stat st;   /* a chmod copies the lower dir up (a dozen FUSE requests): only if needed */
    if ((stat("root/tmp", &st) || (st.st_mode & 07777) != 01777) && chmod("root/tmp", 01777))
        fail("chmod root/tmp");
    must_mount(r->dev, "root/dev", NULL, MS_BIND | MS_REC, NULL);
    must_mount("paddock-shm", "root/dev/shm", "tmpfs", flags | MS_NOEXEC, "mode=1777,size=16m");
    if (chdir("/")) fail("chdir /");
}

/* The init did not answer as expected: kill it; pass its own report on if it sent one. */
static void init_failed(struct buf *msg, pid_t pid, const char *when) {
    char tag;
    const char *val;
    size_t n;
    kill(pid, SIGKILL);
    if (next_rec(msg, 0, &tag, &val, &n) > 0 && tag == 's' && n == 6 && !memcmp(val, "failed", 6)) {
        builder_cleanup();
        send_frame(report_fd, msg, NULL, 0);
        _exit(1);
    }
    errno = EPROTO;
    fail("sandbox init %d failed %s", pid, when);
}

/* The init closed its socket during its setup: pass its own report on if it sent one. */
static void init_gone(pid_t pid) {
    struct buf msg = {0};
    if (recv_frame(mon, &msg, NULL, NULL, 0)) msg.len = 0;
    init_failed(&msg, pid, "during its setup");
}

/* The sandbox's user namespace (made by `helper`, which wrote a byte on `us0` once it had
 * unshared) mapped onto the id slice, setgroups denied: an fd of it. */
static int map_userns(struct build_req *r, int us0, pid_t helper, pid_t init) {
    char c, map[64], path[64];
    if (read(us0, &c, 1) != 1) { kill(init, SIGKILL); errno = ECHILD; fail("the user namespace helper failed"); }
    snprintf(map, sizeof map, "0 %ld %ld\n", r->base, r->size);
    snprintf(path, sizeof path, "/proc/%d/uid_map", helper);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/setgroups", helper);
    write_file(path, "deny");
    snprintf(path, sizeof path, "/proc/%d/gid_map", helper);
    write_file(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", helper);
    int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (userns < 0) { kill(init, SIGKILL); fail("open %s", path); }
    close(us0);   /* the helper exits now; the node init reaps it (this builder does not wait) */
    return userns;
}

/* A spare builder: waits on `agent` (a socket whose other end the node holder handed to the
 * agent) for one create request; builds the sandbox (the agent sends its cgroup.procs files
 * meanwhile); reports to the holder on `sock` and to the agent; exits. */
static int builder_main(int sock, int agent, int bpf_fd) {
    struct buf req = {0}, strings = {0}, out = {0};
    struct build_req r;
    int fds[8], nfds = 0;
    char root[2048], path[64], uid_map[256];
    if (recv_frame(agent, &req, NULL, NULL, 0)) return 0;   /* never used: the node is closing */
    report_fd = agent;
    struct buf stages = {0};
    mark(&stages, "builder");
    const char *bad = parse_build(&req, &r, &strings);
    if (bad) {
        errno = EINVAL;
        fail("create request: %s", bad);
    }
    /* Its own mount namespace: receives the node's image mounts, sends nothing. */
    if (unshare(CLONE_NEWNS)) fail("unshare(CLONE_NEWNS)");
    must_mount("none", "/", NULL, MS_REC | MS_SLAVE, NULL);
    if (r.egress && (egress_fd = open(r.egress, O_PATH | O_CLOEXEC)) < 0) fail("open %s", r.egress);
    /* The sandbox's user namespace: made by a helper now, mapped while the root is built,
     * entered by the init (setns) after its pivot_root. */
    int us[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, us)) fail("socketpair");
    pid_t helper = fork();
    if (helper < 0) fail("fork the user namespace helper");
    if (helper == 0) {
        char c = 'u';
        close(us[0]);
        if (unshare(CLONE_NEWUSER) || write(us[1], &c, 1) != 1) _exit(1);
        if (read(us[1], &c, 1) < 0) {}   /* until the builder has the namespace */
        _exit(0);
    }
    close(us[1]);
    if (unshare(CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)) fail("unshare the sandbox namespaces");
    snprintf(root, sizeof root, "%s/root", r.sbx);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) fail("socketpair");
    pid_t pid = fork();   /* the init, early: it makes its network namespace while the root is built */
    if (pid < 0) fail("fork the sandbox init");
    if (pid == 0) {
        mon = sv[1];
        r.init.root = root;
        r.init.bpf_fd = bpf_fd;
        r.init.forked = 1;
        init_main(&r.init);
        _exit(0);
    }
    close(sv[1]);
    mon = sv[0];
    mark(&stages, "init_forked");
    int userns = -1;
    if (r.nlayers) {   /* the layers' idmapped clones need the mapped namespace */
        userns = map_userns(&r, us[0], helper, pid);
        mark(&stages, "userns_mapped");
    }
    build_root(&r, userns);
    mark(&stages, "root_built");
    /* The init mounts its /proc and pivots into the root while the user namespace is mapped
     * and the cgroups are joined; it enters either only once "userns" comes. */
    rec_str(&out, 's', "root");
    if (send_frame(mon, &out, NULL, 0)) init_gone(pid);
    if (userns < 0) {
        userns = map_userns(&r, us[0], helper, pid);
        mark(&stages, "userns_mapped");
    }
    /* The agent made the sandbox's cgroups meanwhile: their cgroup.procs files come now (a
     * failure instead ends the create). Joined before "userns": the init makes its cgroup
     * namespace after it. */
    int got[1], ngot = 0;
    char tag;
    const char *val;
    size_t n;
    if (recv_frame(report_fd, &req, fds, &nfds, 8) || next_rec(&req, 0, &tag, &val, &n) <= 0 || tag != 'c') {
        kill(pid, SIGKILL);
        builder_cleanup();
        _exit(1);   /* the agent gave up on this create and knows why */
    }
    char pidstr[32];
    int pidlen = snprintf(pidstr, sizeof pidstr, "%d", pid);
    for (int i = 0; i < nfds; i++) {
        if (write(fds[i], pidstr, (size_t)pidlen) != pidlen) { kill(pid, SIGKILL); fail("joining cgroup %d", i); }
        close(fds[i]);
    }
    mark(&stages, "init_in_cgroups");
    rec_str(&out, 's', "userns");
    if (send_frame(mon, &out, &userns, 1)) init_gone(pid);
    close(userns);
    if (recv_frame(mon, &req, got, &ngot, 1) || ngot != 1 || next_rec(&req, 0, &tag, &val, &n) <= 0
        || tag != 's' || n != 5 || memcmp(val, "ready", 5)) {
        if (ngot) close(got[0]);
        init_failed(&req, pid, "during its setup");
    }
    for (long off = 0; (off = next_rec(&req, (size_t)off, &tag, &val, &n)) > 0;) {
        if (tag == 'T') rec(&stages, 'T', val, n);   /* the init's own stage times */
    }
    mark(&stages, "init_ready");
    snprintf(path, sizeof path, "/proc/%d/uid_map", pid);
    int mfd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t ml = mfd >= 0 ? read(mfd, uid_map, sizeof uid_map - 1) : -1;
    if (ml < 0) { kill(pid, SIGKILL); fail("reading %s", path); }
    uid_map[ml] = 0;
    close(mfd);
    int ns[2] = {open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC), got[0]};
    if (ns[0] < 0) { kill(pid, SIGKILL); fail("open /proc/self/ns/mnt"); }
    rec_num(&out, 'p', pid);
    rec_str(&out, 'i', r.id);
    rec_str(&out, 'd', r.sbx);
    rec_str(&out, 'l', r.lowerdir);
    rec_num(&out, 'b', r.base);
    if (send_frame(sock, &out, ns, 2)) { kill(pid, SIGKILL); fail("reporting to the node holder"); }
    /* The agent destroys through this pidfd: it turns readable once the init has exited,
     * which the kernel lets happen only after every other process of its PID namespace. */
    int for_agent[2] = {mon, (int)syscall(SYS_pidfd_open, pid, 0)};
    if (for_agent[1] < 0) { kill(pid, SIGKILL); fail("pidfd_open %d", pid); }
    mark(&stages, "reported");
    rec_str(&out, 's', "ok");
    rec_num(&out, 'p', pid);
    rec_str(&out, 'U', uid_map);
    buf_put(&out, stages.p, stages.len);
    send_frame(report_fd, &out, for_agent, 2);
    return 0;
}

/* ------------------------------------------------------------------ the factory */

/* The node holder's source of spare builders: for each request (a frame with two fds: the
 * builder's socket to the holder, its socket to the agent) it forks a builder and answers
 * with its PID ('p'; minus errno if the fork failed). A fork of this small process costs a
 * third of a fresh exec. It holds nothing of any sandbox; its builders are reaped by the
 * kernel (SIGCHLD ignored here, default again in each builder). Exits when the holder closes. */
static int factory_main(int ctl, int bpf_fd) {
    struct buf req = {0}, out = {0};
    int keep[2] = {ctl, bpf_fd};
    close_all_but(keep, 2);   /* whatever else the holder had open: its builders get none of it */
    signal(SIGCHLD, SIG_IGN);
    for (;;) {
        int fds[2], nfds = 0;
        if (recv_frame(ctl, &req, fds, &nfds, 2)) return 0;
        pid_t pid = -1;
        errno = EINVAL;
        if (nfds == 2) pid = fork();
        if (pid == 0) {
            signal(SIGCHLD, SIG_DFL);
            close(ctl);
            _exit(builder_main(fds[0], fds[1], bpf_fd));
        }
        long long answer = pid > 0 ? pid : -(long long)errno;
        for (int i = 0; i < nfds; i++) close(fds[i]);
        rec_num(&out, 'p', answer);
        if (send_frame(ctl, &out, NULL, 0)) return 0;
    }
}

/* ------------------------------------------------------------------ main */

static void usage_fail(const char *what) {
    errno = EINVAL;
    fail("usage: %s", what);
}

/* paddock-sbxinit builder --sock N --agent-fd A --bpf-fd M     a spare builder (builder_main)
 * paddock-sbxinit factory --ctl N --bpf-fd M                   forks spare builders (factory_main)
 * paddock-sbxinit --mon N --bpf-fd M --root DIR [--hostname H] [--rlimit NAME=V]... [--egress-fd E]
 *                                                     the init, spawned by a Python builder */
int main(int argc, char **argv) {
    struct init_cfg cfg = {.hostname = "sandbox", .bpf_fd = -1};
    int sock = -1, agent = -1, ctl = -1, builder = argc > 1 && !strcmp(argv[1], "builder");
    int factory = argc > 1 && !strcmp(argv[1], "factory");
    signal(SIGPIPE, SIG_IGN);
    for (int i = 1 + builder + factory; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mon")) mon = report_fd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--sock")) sock = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctl")) ctl = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--agent-fd")) agent = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--bpf-fd")) cfg.bpf_fd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--egress-fd")) egress_fd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--root")) cfg.root = argv[i + 1];
        else if (!strcmp(argv[i], "--hostname")) cfg.hostname = argv[i + 1];
        else if (!strcmp(argv[i], "--rlimit") && cfg.nrl < MAX_RLIMITS) cfg.rlimits[cfg.nrl++] = argv[i + 1];
        else if (mon >= 0) usage_fail(argv[i]);
        else return 2;
    }
    if (builder) return sock >= 0 && agent >= 0 && cfg.bpf_fd >= 0 ? builder_main(sock, agent, cfg.bpf_fd) : 2;
    if (factory) return ctl >= 0 && cfg.bpf_fd >= 0 ? factory_main(ctl, cfg.bpf_fd) : 2;
    if (mon < 0) return 2;
    if (!cfg.root || cfg.bpf_fd < 0) usage_fail("--root and --bpf-fd are required");
    init_main(&cfg);
    return 0;
}
