"""An echo server and client in one Python program, on one kernel: the
client sends N messages (and one segment) and prints the median round trip.

    python examples/echo.py [N]
"""

import statistics
import sys
import threading
import time

import vkernel


def main(n: int) -> None:
    with vkernel.Kernel.start("127.0.0.1:0") as k:
        server, client = k.create_process(), k.create_process()
        server.register("py-echo")

        def serve() -> None:
            buf = bytearray(1024)
            while True:
                msg, who = server.receive(buf)
                if msg.code == 0:
                    server.reply(msg, who.sender)
                    return
                # A segment's bytes come back with the reply, in place.
                data = bytes(buf[: who.seg_bytes]) if who.seg_bytes else None
                server.reply(msg, who.sender, data)

        t = threading.Thread(target=serve)
        t.start()
        to = client.lookup("py-echo")
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            reply, _ = client.send(vkernel.Message(1, i), to)
            times.append(time.perf_counter() - t0)
            assert reply[1] == i
        seg = bytearray(b"segment bytes")
        client.send_segment(vkernel.Message(1), to, seg)
        client.send(vkernel.Message(0), to)
        t.join()
        print(f"{n} exchanges: median {statistics.median(times) * 1e6:.2f} us; segment {seg.decode()!r}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10000)
