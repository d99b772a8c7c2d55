/*
 * An echo server in C, speaking the protocol of `vkernel echo`: the
 * message comes back unchanged, and the first part of a read+write
 * segment comes back with the reply. Code 0 stops it.
 *
 *   echo_server [--attach PATH | BIND_ADDRESS] [NAME]
 *
 * Prints "ready ADDRESS PID" once it serves. Ends by itself after 120 s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vkernel.h>

#define ECHO 0x0ec400u
#define CODE(m) ((m).w[0] & VK_CODE_MASK)

static int fail(const char *what, int code) {
    fprintf(stderr, "echo_server: %s: %s (%s)\n", what, vk_strerror(code), vk_last_error());
    return 1;
}

int main(int argc, char **argv) {
    vk_kernel *k = NULL;
    const char *name = "c-echo";
    int rc;
    alarm(120);
    if (argc > 2 && strcmp(argv[1], "--attach") == 0) {
        rc = vk_attach(argv[2], &k);
        if (argc > 3) name = argv[3];
    } else {
        rc = vk_start(argc > 1 ? argv[1] : "127.0.0.1:0", NULL, &k);
        if (argc > 2) name = argv[2];
    }
    if (rc) return fail("start", rc);
    vk_process *p = NULL;
    if ((rc = vk_process_create(k, &p))) return fail("process", rc);
    if ((rc = vk_set_pid(p, vk_service_id(name), vk_pid(p), VK_SCOPE_ANY))) return fail("set pid", rc);
    char addr[64];
    if ((rc = vk_local_addr(k, addr, sizeof addr))) return fail("address", rc);
    printf("ready %s %08x\n", addr, vk_pid(p));
    fflush(stdout);
    static unsigned char buf[65536];
    unsigned long served = 0;
    for (;;) {
        vk_message m;
        vk_incoming in;
        if ((rc = vk_receive_segment(p, &m, buf, sizeof buf, &in))) return fail("receive", rc);
        if (CODE(m) == 0) {
            vk_reply(p, &m, in.from);
            break;
        }
        if (CODE(m) == ECHO && in.seg_bytes > 0 && (m.w[0] & VK_FLAG_SEG_WRITE))
            rc = vk_reply_segment(p, &m, in.from, 0, buf, in.seg_bytes);
        else
            rc = vk_reply(p, &m, in.from);
        if (rc) fprintf(stderr, "echo_server: reply: %s\n", vk_strerror(rc));
        served++;
    }
    printf("served %lu\n", served);
    vk_process_free(p);
    vk_kernel_free(k);
    return 0;
}
