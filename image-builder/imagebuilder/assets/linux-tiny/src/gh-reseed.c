/*
 * gh-reseed HEX: add the bytes HEX spells to the kernel's entropy pool, credited, then reseed the
 * CRNG that /dev/urandom and getrandom() read from. Run by the exec wrapper in a machine's first
 * script after a memory restore (providers/qemu/guest_agent.py), with bytes from the host's CSPRNG.
 *
 * Why: machines restored from one memory image start with the image's CRNG key, and Linux renews
 * it only when it is old by the guest's own clock (up to 60 s, which a restore replays), so they
 * would read the same "random" bytes. Writing to /dev/urandom only mixes into the input pool, and
 * the key is not renewed from it until then. So: RNDADDENTROPY credits the bytes (on a guest saved
 * before its CRNG was ready, crediting is what makes it ready and seeds it from the pool: lazy
 * copies of a warm snapshot taken right after boot under TCG, no RDRAND, refused RNDRESEEDCRNG
 * alone, which the kernel does until its CRNG is ready), and RNDRESEEDCRNG extracts a new key at once on a ready one. (A kernel with
 * a VM generation ID driver reseeds on restore by itself; linux-tiny's cloud kernel has none.)
 *
 * No libc (built with -nostdlib -static): four system calls, nothing to link against. Exit 0 when
 * reseeded, 1 when the kernel refused, 2 on a bad argument.
 */

#define SYS_open 2
#define SYS_ioctl 16
#define SYS_exit 60
#define O_WRONLY 1
#define RNDADDENTROPY 0x40085203 /* _IOW('R', 0x03, int[2]), linux/random.h */
#define RNDRESEEDCRNG 0x5207 /* _IO('R', 0x07) */
#define MAX_BYTES 64

struct pool_info { /* struct rand_pool_info */
    int entropy_count; /* bits */
    int buf_size; /* bytes */
    unsigned char buf[MAX_BYTES];
};

static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static __attribute__((noreturn)) void quit(long code) {
    for (;;) sys3(SYS_exit, code, 0, 0);
}

static int nibble(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

__attribute__((used)) void gh_main(long *sp) {
    struct pool_info info;
    int n = 0;
    const char *hex;
    if (sp[0] != 2) quit(2);
    hex = (const char *)sp[2];
    for (; hex[0] && hex[1] && n < MAX_BYTES; hex += 2) {
        int hi = nibble(hex[0]), lo = nibble(hex[1]);
        if (hi < 0 || lo < 0) quit(2);
        info.buf[n++] = (unsigned char)(hi << 4 | lo);
    }
    if (hex[0] || n == 0) quit(2);
    info.entropy_count = 8 * n;
    info.buf_size = n;
    long fd = sys3(SYS_open, (long)"/dev/urandom", O_WRONLY, 0);
    if (fd < 0) quit(1);
    if (sys3(SYS_ioctl, fd, RNDADDENTROPY, (long)&info) != 0) quit(1);
    quit(sys3(SYS_ioctl, fd, RNDRESEEDCRNG, 0) == 0 ? 0 : 1);
}

/* The kernel enters here with argc at the stack pointer and argv after it. */
__asm__(".globl _start\n_start:\n\tmov %rsp, %rdi\n\tand $-16, %rsp\n\tcall gh_main\n\thlt\n");
