/*
 * gh-execd: the resident script executor of a linux-tiny guest. It waits on its own virtio serial
 * port (org.ghrunner.exec.0) for a script, runs it, and answers with its exit and its output.
 *
 * Why not qemu-ga's guest-exec alone: under TCG every process costs 10-30 ms to start, and a
 * guest-exec script takes four (qemu-ga's fork of itself, the wrapper sh, setsid, the script's sh)
 * and two or more status polls over libvirt. This process is already running, is small (its fork
 * copies a few pages), sets the clock and reseeds the RNG with system calls instead of starting
 * `date` and gh-reseed, and answers on its own when the script exits: one request, one reply.
 * qemu-ga stays the fallback for everything this does not do (another user, bigger output).
 *
 * The wire format is the host's too: providers/qemu/execd.py, which documents it. Integers are
 * little-endian.
 *   request: magic "GHX1", id, flags (1: set the clock, 2: reseed the RNG), timeout_ms, keep (bytes
 *            kept per stream), reseed_len, clock_ms (u64), interp_len, env_len, script_len, 0;
 *            then the reseed bytes, the interpreter's path, the environment ("K=V\0"...), the script.
 *   reply:   magic "GHXR", id, kind (see enum kind), code, out_len, err_len; then out, then err.
 * The script runs as the wrapper of providers/qemu/guest_agent.py runs it: `interp /proc/self/fd/3`
 * in its own session, the script's text on fd 3, stdin /dev/null, umask 077, exactly the given
 * environment. At its deadline its whole session is killed and the reply says so, with the output
 * so far; the time a takeover's hold kept it frozen does not count (held_ms). Output past `keep` bytes is read and dropped, so the script never blocks on a full pipe.
 *
 * No libc (built with -nostdlib -static): system calls only, every buffer static. One script at a
 * time: the host sends the next request after the reply (a second script at once goes to qemu-ga).
 */

#define SYS_read 0
#define SYS_write 1
#define SYS_open 2
#define SYS_close 3
#define SYS_poll 7
#define SYS_rt_sigprocmask 14
#define SYS_ioctl 16
#define SYS_dup2 33
#define SYS_nanosleep 35
#define SYS_getpid 39
#define SYS_fork 57
#define SYS_execve 59
#define SYS_exit 60
#define SYS_wait4 61
#define SYS_kill 62
#define SYS_fcntl 72
#define SYS_umask 95
#define SYS_setsid 112
#define SYS_clock_settime 227
#define SYS_clock_gettime 228
#define SYS_signalfd4 289
#define SYS_pipe2 293

#define O_RDONLY 0
#define O_WRONLY 1
#define O_RDWR 2
#define O_NONBLOCK 04000
#define O_ASYNC 020000
#define O_CLOEXEC 02000000
#define F_SETFD 2
#define F_GETFL 3
#define F_SETFL 4
#define F_SETOWN 8
#define POLLIN 1
#define POLLOUT 4
#define POLLERR 8
#define POLLHUP 16
#define EINTR 4
#define EAGAIN 11
#define WNOHANG 1
#define SIGKILL 9
#define SIGPIPE 13
#define SIGCHLD 17
#define SIGIO 29
#define SIG_BLOCK 0
#define SIG_SETMASK 2
#define CLOCK_REALTIME 0
#define CLOCK_MONOTONIC 1
#define CLOCK_BOOTTIME 7 /* /proc/uptime's clock */
#define RNDADDENTROPY 0x40085203 /* _IOW('R', 0x03, int[2]), linux/random.h */
#define RNDRESEEDCRNG 0x5207 /* _IO('R', 0x07) */

#define PORT_NAME "org.ghrunner.exec.0"
#define REQ_MAGIC 0x31584847u /* "GHX1" */
#define REP_MAGIC 0x52584847u /* "GHXR" */
#define FLAG_CLOCK 1u
#define FLAG_RESEED 2u
#define MAX_RESEED 64
#define MAX_INTERP 255
#define MAX_ENV (64 * 1024)
#define MAX_ENV_VARS 1024
#define MAX_SCRIPT (1024 * 1024)
#define MAX_KEEP (1024 * 1024 + 1)
/* Kept by the hold's freeze script (providers/qemu/agent_groups.py): "<held centiseconds> <uptime in
 * centiseconds when the current freeze began, or 0>". */
#define HELD_FILE "/run/gh-agent.held"
#define HELD_LOOK_MS 100

enum kind {
    EXITED = 0, /* code: the exit status */
    SIGNALED = 1, /* code: the signal */
    TIMED_OUT = 2, /* killed at its deadline, with its session */
    CLOCK_NOT_SET = 3, /* the script did not run; code: errno */
    RNG_NOT_RESEEDED = 4, /* the script did not run; code: errno */
    BAD_REQUEST = 5, /* the script did not run; nothing was read past this request */
    NOT_STARTED = 6, /* fork or pipe failed; code: errno (an exec failure is the child's exit 127) */
};

typedef unsigned int u32;
typedef unsigned long long u64;

struct request {
    u32 magic, id, flags, timeout_ms, keep, reseed_len;
    u64 clock_ms;
    u32 interp_len, env_len, script_len, zero;
};

struct reply {
    u32 magic, id, kind;
    int code;
    u32 out_len, err_len;
};

struct timespec { long sec, nsec; };
struct pollfd { int fd; short events, revents; };
struct pool_info { int entropy_count, buf_size; unsigned char buf[MAX_RESEED]; };
struct siginfo_fd { unsigned char bytes[128]; }; /* struct signalfd_siginfo: only drained */

static unsigned char req_buf[sizeof(struct request) + MAX_RESEED + MAX_INTERP + 1 + MAX_ENV + MAX_SCRIPT];
static unsigned char out_buf[sizeof(struct reply) + 2 * MAX_KEEP];
static unsigned char drop_buf[64 * 1024];
static char *envp[MAX_ENV_VARS + 1];
static char interp[MAX_INTERP + 1];

static long sc6(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
}
#define sc(n, a, b, c) sc6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)

/* gcc may call these for struct copies and zeroing even without libc. */
__attribute__((used)) void *memset(void *d, int c, unsigned long n) {
    unsigned char *p = d;
    while (n--) *p++ = (unsigned char)c;
    return d;
}
__attribute__((used)) void *memcpy(void *d, const void *s, unsigned long n) {
    unsigned char *p = d;
    const unsigned char *q = s;
    while (n--) *p++ = *q++;
    return d;
}

static __attribute__((noreturn)) void quit(long code) {
    for (;;) sc(SYS_exit, code, 0, 0);
}

static long now_ms(void) {
    struct timespec t;
    sc(SYS_clock_gettime, CLOCK_MONOTONIC, &t, 0);
    return t.sec * 1000 + t.nsec / 1000000;
}

/* How long the agent's exec groups have stood frozen by takeovers' holds since boot, in ms (0 when
 * no hold ever froze them). An agent's script is frozen for its hold; that time is not its own, so
 * its deadline moves on by it, as the host's own bound on it does (execd.py). */
static long held_ms(void) {
    char b[64];
    long fd = sc(SYS_open, HELD_FILE, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    long n = sc(SYS_read, fd, b, sizeof b - 1);
    sc(SYS_close, fd, 0, 0);
    long v[2] = {0, 0};
    int i = 0;
    for (long k = 0; k < n && i < 2; k++) {
        if (b[k] >= '0' && b[k] <= '9') v[i] = v[i] * 10 + (b[k] - '0');
        else if (k > 0 && b[k - 1] >= '0' && b[k - 1] <= '9') i++;
    }
    long held = v[0] * 10;
    if (v[1] > 0) { /* frozen now: the current freeze counts up to this moment */
        struct timespec t;
        sc(SYS_clock_gettime, CLOCK_BOOTTIME, &t, 0);
        long up = t.sec * 1000 + t.nsec / 1000000;
        if (up > v[1] * 10) held += up - v[1] * 10;
    }
    return held;
}

static void nap_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
    sc(SYS_nanosleep, &t, 0, 0);
}

static int streq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static int set_nonblock(int fd) {
    long fl = sc(SYS_fcntl, fd, F_GETFL, 0);
    return fl < 0 ? -1 : (int)sc(SYS_fcntl, fd, F_SETFL, fl | O_NONBLOCK);
}

/* "/sys/class/virtio-ports/vportDpP/name" and "/dev/vportDpP" for D, P < 10 and < 32. */
static int open_port(void) {
    char name[64], dev[24];
    for (int d = 0; d < 4; d++) {
        for (int p = 0; p < 32; p++) {
            char *w = name;
            for (const char *s = "/sys/class/virtio-ports/vport"; *s;) *w++ = *s++;
            char *id = w;
            *w++ = (char)('0' + d);
            *w++ = 'p';
            if (p >= 10) *w++ = (char)('0' + p / 10);
            *w++ = (char)('0' + p % 10);
            int idlen = (int)(w - id);
            for (const char *s = "/name"; *s;) *w++ = *s++;
            *w = 0;
            long fd = sc(SYS_open, name, O_RDONLY | O_CLOEXEC, 0);
            if (fd < 0) continue;
            char got[64];
            long n = sc(SYS_read, fd, got, sizeof got - 1);
            sc(SYS_close, fd, 0, 0);
            if (n <= 0) continue;
            got[n] = 0;
            if (got[n - 1] == '\n') got[n - 1] = 0;
            if (!streq(got, PORT_NAME)) continue;
            w = dev;
            for (const char *s = "/dev/vport"; *s;) *w++ = *s++;
            for (int i = 0; i < idlen; i++) *w++ = id[i];
            *w = 0;
            return (int)sc(SYS_open, dev, O_RDWR | O_NONBLOCK | O_CLOEXEC, 0);
        }
    }
    return -1;
}

/* The guest clock after a restore: the host's time as it sent the request, or the RTC's second
 * if that is later (QEMU drives the RTC from the host's clock: a request that waited on a loaded
 * host must not set the clock back). */
static long set_clock(u64 host_ms) {
    u64 ms = host_ms;
    long fd = sc(SYS_open, "/sys/class/rtc/rtc0/since_epoch", O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        char b[32];
        long n = sc(SYS_read, fd, b, sizeof b);
        sc(SYS_close, fd, 0, 0);
        u64 rtc = 0;
        int ok = n > 0;
        for (long i = 0; i < n && b[i] != '\n'; i++) {
            if (b[i] < '0' || b[i] > '9') { ok = 0; break; }
            rtc = rtc * 10 + (u64)(b[i] - '0');
        }
        if (ok && rtc * 1000 > ms) ms = rtc * 1000;
    }
    struct timespec t = {(long)(ms / 1000), (long)(ms % 1000) * 1000000};
    long r = sc(SYS_clock_settime, CLOCK_REALTIME, &t, 0);
    return r < 0 ? -r : 0;
}

/* As gh-reseed.c (whose comment says why both ioctls). */
static long reseed(const unsigned char *bytes, u32 n) {
    struct pool_info info;
    info.entropy_count = (int)(8 * n);
    info.buf_size = (int)n;
    memcpy(info.buf, bytes, n);
    long fd = sc(SYS_open, "/dev/urandom", O_WRONLY | O_CLOEXEC, 0);
    if (fd < 0) return -fd;
    long r = sc(SYS_ioctl, fd, RNDADDENTROPY, &info);
    if (r == 0) r = sc(SYS_ioctl, fd, RNDRESEEDCRNG, 0);
    sc(SYS_close, fd, 0, 0);
    return r < 0 ? -r : 0;
}

/* Write all of buf to the port; 0 when the host went away first (the reply is dropped). */
static int write_all(int port, const unsigned char *buf, u64 len) {
    while (len > 0) {
        long n = sc(SYS_write, port, buf, len);
        if (n > 0) {
            buf += n;
            len -= (u64)n;
            continue;
        }
        if (n != -EAGAIN && n != -EINTR) return 0;
        struct pollfd p = {port, POLLOUT, 0};
        if (sc(SYS_poll, &p, 1, 5000) <= 0 || (p.revents & (POLLHUP | POLLERR))) return 0;
    }
    return 1;
}

static void answer(int port, u32 id, u32 kind, int code, u32 out_len, u32 err_len) {
    /* out and err already sit after the header in out_buf (err right after out) */
    struct reply *r = (struct reply *)out_buf;
    r->magic = REP_MAGIC;
    r->id = id;
    r->kind = kind;
    r->code = code;
    r->out_len = out_len;
    r->err_len = err_len;
    write_all(port, out_buf, sizeof *r + (u64)out_len + err_len);
}

struct stream { int fd; unsigned char *buf; u32 len, keep; };

/* Read what is there; close at EOF. Bytes past `keep` are dropped. */
static void pump(struct stream *s) {
    while (s->fd >= 0) {
        unsigned char *to = s->len < s->keep ? s->buf + s->len : drop_buf;
        u64 room = s->len < s->keep ? s->keep - s->len : sizeof drop_buf;
        long n = sc(SYS_read, s->fd, to, room);
        if (n > 0) {
            if (s->len < s->keep) s->len += (u32)n;
            continue;
        }
        if (n == -EAGAIN || n == -EINTR) return;
        sc(SYS_close, s->fd, 0, 0);
        s->fd = -1;
    }
}

static void child(int devnull, int out_w, int err_w, int script_r) {
    u64 none = 0;
    sc6(SYS_rt_sigprocmask, SIG_SETMASK, (long)&none, 0, 8, 0, 0);
    sc(SYS_setsid, 0, 0, 0);
    int from[4] = {devnull, out_w, err_w, script_r};
    for (int i = 0; i < 4; i++) {
        if (from[i] == i) sc(SYS_fcntl, i, F_SETFD, 0); /* dup2 onto itself keeps close-on-exec */
        else sc(SYS_dup2, from[i], i, 0);
    }
    sc(SYS_umask, 077, 0, 0);
    char *argv[] = {interp, "/proc/self/fd/3", 0};
    long e = sc(SYS_execve, interp, argv, envp);
    static const char msg[] = "gh-execd: cannot start the interpreter\n";
    sc(SYS_write, 2, msg, sizeof msg - 1);
    quit(e == -2 ? 127 : 126);
}

/* Run one parsed request to its reply. */
static void run(int port, int sfd, int devnull, const struct request *q, const unsigned char *script) {
    int o[2], e[2], s[2];
    long r;
    if ((r = sc(SYS_pipe2, o, O_CLOEXEC, 0)) < 0) goto not_started;
    if ((r = sc(SYS_pipe2, e, O_CLOEXEC, 0)) < 0) { sc(SYS_close, o[0], 0, 0); sc(SYS_close, o[1], 0, 0); goto not_started; }
    if ((r = sc(SYS_pipe2, s, O_CLOEXEC, 0)) < 0) {
        for (int i = 0; i < 2; i++) sc(SYS_close, o[i], 0, 0), sc(SYS_close, e[i], 0, 0);
        goto not_started;
    }
    long pid = sc(SYS_fork, 0, 0, 0);
    if (pid == 0) child(devnull, o[1], e[1], s[0]);
    sc(SYS_close, o[1], 0, 0);
    sc(SYS_close, e[1], 0, 0);
    sc(SYS_close, s[0], 0, 0);
    if (pid < 0) {
        sc(SYS_close, o[0], 0, 0), sc(SYS_close, e[0], 0, 0), sc(SYS_close, s[1], 0, 0);
        r = pid;
        goto not_started;
    }
    set_nonblock(o[0]);
    set_nonblock(e[0]);
    set_nonblock(s[1]);
    unsigned char *outs = out_buf + sizeof(struct reply);
    struct stream out = {o[0], outs, 0, q->keep};
    struct stream err = {e[0], outs + q->keep, 0, q->keep};
    int script_w = s[1];
    u32 sent = 0;
    int status = 0, exited = 0, timed_out = 0;
    long started = now_ms(), held_before = held_ms();
    long deadline = started + q->timeout_ms;
    while (!exited) {
        struct pollfd p[4] = {{sfd, POLLIN, 0}, {out.fd, POLLIN, 0}, {err.fd, POLLIN, 0}, {script_w, POLLOUT, 0}};
        long wait = -1;
        if (!timed_out) wait = deadline - now_ms() > 0 ? deadline - now_ms() : 0;
        long n = sc(SYS_poll, p, 4, wait);
        if (n == 0 && !timed_out) {
            /* Only read at the deadline: a hold that froze the script meanwhile moves it on. While the
             * hold lasts it is looked at again every HELD_LOOK_MS at most. */
            long later = started + q->timeout_ms + (held_ms() - held_before), now = now_ms();
            if (later > now) {
                deadline = later - now > HELD_LOOK_MS ? later : now + HELD_LOOK_MS;
            } else {
                sc(SYS_kill, -pid, SIGKILL, 0); /* its whole session: it is the session's leader */
                sc(SYS_kill, pid, SIGKILL, 0);
                timed_out = 1;
            }
        }
        if (p[0].revents & POLLIN) {
            struct siginfo_fd si;
            while (sc(SYS_read, sfd, &si, sizeof si) > 0) {}
        }
        if (sc6(SYS_wait4, pid, (long)&status, WNOHANG, 0, 0, 0) == pid) exited = 1;
        if (p[1].revents) pump(&out);
        if (p[2].revents) pump(&err);
        if (script_w >= 0 && p[3].revents) {
            long w = p[3].revents & POLLOUT ? sc(SYS_write, script_w, script + sent, q->script_len - sent) : -1;
            if (w > 0) sent += (u32)w;
            if ((w < 0 && w != -EAGAIN) || sent == q->script_len) {
                sc(SYS_close, script_w, 0, 0);
                script_w = -1;
            }
        }
    }
    /* What it wrote before it exited is in the pipes; what a child it left behind writes later is not
     * waited for (the wrapper of guest_agent.py reads its files at the same moment). */
    pump(&out);
    pump(&err);
    if (out.fd >= 0) sc(SYS_close, out.fd, 0, 0);
    if (err.fd >= 0) sc(SYS_close, err.fd, 0, 0);
    if (script_w >= 0) sc(SYS_close, script_w, 0, 0);
    /* err follows out directly in the reply */
    if (out.len < q->keep) memcpy(outs + out.len, outs + q->keep, err.len);
    u32 kind = timed_out ? TIMED_OUT : (status & 0x7f) ? SIGNALED : EXITED;
    int code = kind == SIGNALED ? (status & 0x7f) : kind == EXITED ? (status >> 8) & 0xff : SIGKILL;
    answer(port, q->id, kind, code, out.len, err.len);
    return;
not_started:
    answer(port, q->id, NOT_STARTED, (int)-r, 0, 0);
}

/* The request in req_buf[0:have] is whole: check it, do its clock and reseed, run its script. */
static void handle(int port, int sfd, int devnull) {
    const struct request *q = (const struct request *)req_buf;
    const unsigned char *p = req_buf + sizeof *q;
    const unsigned char *bytes = p;
    const char *iv = (const char *)(p + q->reseed_len);
    char *env = (char *)(p + q->reseed_len + q->interp_len);
    const unsigned char *script = p + q->reseed_len + q->interp_len + q->env_len;
    int vars = 0;
    if (q->interp_len == 0 || q->keep > MAX_KEEP || (q->env_len > 0 && env[q->env_len - 1] != 0)) goto bad;
    for (u32 i = 0; i < q->interp_len; i++) {
        if (iv[i] == 0) goto bad;
        interp[i] = iv[i];
    }
    interp[q->interp_len] = 0;
    for (u32 i = 0; i < q->env_len; i++) {
        if (i == 0 || env[i - 1] == 0) {
            if (vars == MAX_ENV_VARS) goto bad;
            envp[vars++] = env + i;
        }
    }
    envp[vars] = 0;
    if (q->flags & FLAG_CLOCK) {
        long r = set_clock(q->clock_ms);
        if (r) { answer(port, q->id, CLOCK_NOT_SET, (int)r, 0, 0); return; }
    }
    if ((q->flags & FLAG_RESEED) && q->reseed_len > 0) {
        long r = reseed(bytes, q->reseed_len);
        if (r) { answer(port, q->id, RNG_NOT_RESEEDED, (int)r, 0, 0); return; }
    }
    run(port, sfd, devnull, q, script);
    return;
bad:
    answer(port, q->id, BAD_REQUEST, 0, 0, 0);
}

/* How many bytes the request at req_buf needs in all, 0 while its header is incomplete, or
 * (u64)-1 when it cannot be one of ours. */
static u64 wanted(u64 have) {
    const struct request *q = (const struct request *)req_buf;
    if (have < sizeof *q) return 0;
    if (q->magic != REQ_MAGIC || q->zero != 0 || q->reseed_len > MAX_RESEED || q->interp_len > MAX_INTERP ||
        q->env_len > MAX_ENV || q->script_len > MAX_SCRIPT)
        return (u64)-1;
    return sizeof *q + (u64)q->reseed_len + q->interp_len + q->env_len + q->script_len;
}

__attribute__((used)) void gh_main(void) {
    /* SIGIO (the host connected, or sent bytes) and SIGCHLD come through a signalfd; SIGPIPE would
     * kill us when a script exits without reading its text. */
    /* fds 0-2 taken, so no pipe or port lands where a child's dup2 onto 0-3 would clobber it */
    for (;;) {
        long fd = sc(SYS_open, "/dev/null", O_RDWR, 0);
        if (fd < 0) break;
        if (fd > 2) { sc(SYS_close, fd, 0, 0); break; }
    }
    u64 mask = (1ull << (SIGIO - 1)) | (1ull << (SIGCHLD - 1)) | (1ull << (SIGPIPE - 1));
    sc6(SYS_rt_sigprocmask, SIG_BLOCK, (long)&mask, 0, 8, 0, 0);
    u64 wake = (1ull << (SIGIO - 1)) | (1ull << (SIGCHLD - 1));
    int sfd = (int)sc6(SYS_signalfd4, -1, (long)&wake, 8, O_NONBLOCK | O_CLOEXEC, 0, 0);
    int devnull = (int)sc(SYS_open, "/dev/null", O_RDWR | O_CLOEXEC, 0);
    if (sfd < 0 || devnull < 0) quit(1);
    /* The port appears once virtio_console has probed (or never, on a domain without it): often
     * at first, rarely after, so a machine without the port stays idle. */
    int port;
    for (int tries = 0; (port = open_port()) < 0; tries++) nap_ms(tries < 250 ? 20 : 1000);
    long pid = sc(SYS_getpid, 0, 0, 0);
    sc(SYS_fcntl, port, F_SETOWN, pid);
    sc(SYS_fcntl, port, F_SETFL, O_RDWR | O_NONBLOCK | O_ASYNC);
    u64 have = 0;
    int connected = 1;
    for (;;) {
        if (!connected) {
            /* No host on the port: it polls as hung up and reads as EOF at once, so wait for the
             * SIGIO its connection sends (or a second, in case one was missed). */
            struct pollfd w = {sfd, POLLIN, 0};
            sc(SYS_poll, &w, 1, 1000);
            struct siginfo_fd si;
            while (sc(SYS_read, sfd, &si, sizeof si) > 0) {}
            connected = 1;
            continue;
        }
        struct pollfd p[2] = {{port, POLLIN, 0}, {sfd, POLLIN, 0}};
        sc(SYS_poll, p, 2, -1);
        if (p[1].revents & POLLIN) {
            struct siginfo_fd si;
            while (sc(SYS_read, sfd, &si, sizeof si) > 0) {}
        }
        if (!(p[0].revents & (POLLIN | POLLHUP))) continue;
        u64 want = wanted(have);
        u64 room = (want && want != (u64)-1 ? want : sizeof(struct request)) - have;
        long n = sc(SYS_read, port, req_buf + have, room);
        if (n == -EAGAIN || n == -EINTR) continue;
        if (n <= 0) { /* the host hung up: a half request is forgotten */
            connected = 0;
            have = 0;
            continue;
        }
        have += (u64)n;
        want = wanted(have);
        if (want == (u64)-1) {
            /* Not a request of ours: say so and drop the connection's bytes until it hangs up. */
            answer(port, 0, BAD_REQUEST, 0, 0, 0);
            have = 0;
            while (sc(SYS_read, port, req_buf, sizeof req_buf) > 0) {}
            continue;
        }
        if (want && have == want) {
            handle(port, sfd, devnull);
            have = 0;
        }
    }
}

/* The kernel enters here with argc at the stack pointer; the stack is aligned before the call. */
__asm__(".globl _start\n_start:\n\tand $-16, %rsp\n\tcall gh_main\n\thlt\n");
