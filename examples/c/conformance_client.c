/*
 * The client side of the conformance suite's "C ABI" row
 * (crates/vkernel/tests/conformance.rs): attaches to a machine host,
 * creates one process, prints "pid HEX", then runs Sends read from
 * stdin, one per line, and answers each on stdout:
 *
 *   send TO DEADLINE_US W0 W1 W2 W3 W4 W5 W6 W7   (hex pid, decimal rest)
 *   -> ok FROM W0 ... W7   |   err CODE
 *
 * A deadline of 0 means none. "quit" or end of input ends it.
 *
 *   conformance_client SOCKET
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <vkernel.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: conformance_client SOCKET\n");
        return 2;
    }
    /* Bounded: the suite's cells end in seconds. */
    alarm(300);
    if (strcmp(vk_version(), VK_VERSION) != 0) {
        fprintf(stderr, "conformance_client: built with vkernel.h %s, running libvkernel %s\n",
                VK_VERSION, vk_version());
        return 1;
    }
    vk_kernel *k = NULL;
    int rc = vk_attach(argv[1], &k);
    if (rc) {
        fprintf(stderr, "conformance_client: attach: %s (%s)\n", vk_strerror(rc), vk_last_error());
        return 1;
    }
    vk_process *p = NULL;
    if ((rc = vk_process_create(k, &p))) {
        fprintf(stderr, "conformance_client: process: %s\n", vk_strerror(rc));
        return 1;
    }
    printf("pid %08" PRIx32 "\n", vk_pid(p));
    fflush(stdout);
    char line[512];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "quit", 4) == 0) break;
        uint32_t to = 0;
        uint64_t deadline = 0;
        vk_message m;
        memset(&m, 0, sizeof m);
        int got = sscanf(line, "send %" SCNx32 " %" SCNu64 " %" SCNu32 " %" SCNu32 " %" SCNu32
                               " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32 " %" SCNu32,
                         &to, &deadline, &m.w[0], &m.w[1], &m.w[2], &m.w[3], &m.w[4], &m.w[5],
                         &m.w[6], &m.w[7]);
        if (got != 10) {
            printf("err %d\n", VK_EINVAL);
            fflush(stdout);
            continue;
        }
        vk_reply_info r;
        memset(&r, 0, sizeof r);
        rc = vk_send_within(p, &m, to, deadline, &r);
        if (rc) {
            printf("err %d\n", rc);
        } else {
            printf("ok %08" PRIx32, r.from);
            for (int i = 0; i < 8; i++) printf(" %" PRIu32, m.w[i]);
            printf("\n");
        }
        fflush(stdout);
    }
    vk_process_free(p);
    vk_kernel_free(k);
    return 0;
}
