/*
 * (Words 6 and 7 of a message belong to the kernel: they describe a
 * segment, and are zero without one.)
 *
 * An echo client in C: finds an echo server by name (this one's or
 * `vkernel echo`), exchanges N messages and one segment with it, checks
 * every answer, and prints the round trip.
 *
 *   echo_client (--attach PATH | --peer ADDRESS) NAME N [--stop]
 *
 * Prints "ok N median-us" and exits 0, or says what failed and exits 1.
 * --stop sends the server code 0 at the end (echo_server then exits).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <vkernel.h>

#define ECHO 0x0ec400u

static int fail(const char *what, int code) {
    fprintf(stderr, "echo_client: %s: %s (%s)\n", what, vk_strerror(code), vk_last_error());
    return 1;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: echo_client (--attach PATH | --peer ADDRESS) NAME N [--stop]\n");
        return 2;
    }
    alarm(120);
    vk_kernel *k = NULL;
    int rc = strcmp(argv[1], "--attach") == 0 ? vk_attach(argv[2], &k)
                                              : vk_start("127.0.0.1:0", argv[2], &k);
    if (rc) return fail("start", rc);
    const char *name = argv[3];
    long n = atol(argv[4]);
    if (n < 1 || n > 10000000) n = 1;
    vk_process *p = NULL;
    if ((rc = vk_process_create(k, &p))) return fail("process", rc);
    uint32_t server = 0;
    for (int i = 0; i < 50 && server == 0; i++) {
        if ((rc = vk_get_pid(p, vk_service_id(name), VK_SCOPE_ANY, &server))) return fail("get pid", rc);
        if (server == 0) usleep(100000);
    }
    if (server == 0) {
        fprintf(stderr, "echo_client: no process is registered as %s\n", name);
        return 1;
    }
    double *t = malloc(sizeof(double) * (size_t)n);
    if (!t) return 1;
    for (long i = 0; i < n; i++) {
        vk_message m = {{ECHO, (uint32_t)i, 0xfeedu, 0, 0, (uint32_t)~i, 0, 0}};
        vk_reply_info r;
        double t0 = now_us();
        if ((rc = vk_send(p, &m, server, &r))) return fail("send", rc);
        t[i] = now_us() - t0;
        if ((m.w[0] & VK_CODE_MASK) != ECHO || m.w[1] != (uint32_t)i || m.w[5] != (uint32_t)~i || r.from != server) {
            fprintf(stderr, "echo_client: exchange %ld came back wrong: %08x %08x ... %08x from %08x\n", i,
                    m.w[0], m.w[1], m.w[5], r.from);
            return 1;
        }
    }
    /* One segment: its bytes come back with the reply. */
    unsigned char seg[64];
    for (int i = 0; i < 64; i++) seg[i] = (unsigned char)(i * 7);
    vk_message m = {{ECHO, 0, 0, 0, 0, 0, 0, 0}};
    vk_reply_info r;
    if ((rc = vk_send_segment(p, &m, server, seg, sizeof seg, VK_SEG_READ_WRITE, &r))) return fail("send segment", rc);
    for (int i = 0; i < 64; i++)
        if (seg[i] != (unsigned char)(i * 7)) {
            fprintf(stderr, "echo_client: segment byte %d came back wrong\n", i);
            return 1;
        }
    if (r.seg_bytes != sizeof seg) {
        fprintf(stderr, "echo_client: %u segment bytes came back, not %zu\n", r.seg_bytes, sizeof seg);
        return 1;
    }
    qsort(t, (size_t)n, sizeof(double), cmp);
    printf("ok %ld %.2f\n", n, t[n / 2]);
    if (argc > 5 && strcmp(argv[5], "--stop") == 0) {
        vk_message stop = {{0}};
        vk_send(p, &stop, server, NULL);
    }
    free(t);
    vk_process_free(p);
    vk_kernel_free(k);
    return 0;
}
