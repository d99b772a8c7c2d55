"""The client side of the conformance suite's "Python" row
(crates/vkernel/tests/conformance.rs), as examples/c/conformance_client.c
is the C ABI's: attaches to a machine host, creates one process, prints
"pid HEX", then runs Sends read from stdin, one per line:

    send TO DEADLINE_US W0 ... W7   (hex pid, decimal rest; deadline 0: none)
    -> ok FROM W0 ... W7   |   err CODE

"quit" or end of input ends it. (Not collected by pytest: no test_ prefix.)

    python conformance_client.py SOCKET
"""

import sys

import vkernel


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: conformance_client.py SOCKET", file=sys.stderr)
        return 2
    # (The process closes before its kernel: what it counted outside
    # the host reaches the host as it ends.)
    with vkernel.Kernel.attach(sys.argv[1]) as k, k.create_process() as p:
        print(f"pid {p.pid:08x}", flush=True)
        for line in sys.stdin:
            f = line.split()
            if not f or f[0] == "quit":
                break
            if f[0] != "send" or len(f) != 11:
                print("err 100", flush=True)
                continue
            to, deadline = int(f[1], 16), int(f[2])
            m = vkernel.Message(*[int(w) for w in f[3:]])
            try:
                r, frm = p.send(m, to, deadline / 1e6 if deadline else None)
            except vkernel.VkernelError as e:
                print(f"err {e.args[1]}", flush=True)
                continue
            words = " ".join(str(w) for w in r.words)
            print(f"ok {frm:08x} {words}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
