"""The Python bindings against real kernels: threads of one program,
two programs attached to one machine host, and errors."""

import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

import vkernel
from vkernel import Kernel, Message


def echo(server: vkernel.Process, n: int, buffer=None) -> threading.Thread:
    """Serves n requests: word 1 + 1; a readable segment's bytes come back
    reversed with the reply."""

    def run():
        for _ in range(n):
            msg, who = server.receive(buffer)
            msg[1] = msg[1] + 1
            if buffer is not None and who.seg_bytes:
                server.reply(msg, who.sender, bytes(buffer[: who.seg_bytes])[::-1])
            else:
                server.reply(msg, who.sender)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_send_receive_reply_between_threads():
    with Kernel.start("127.0.0.1:0") as k:
        s, c = k.create_process(), k.create_process()
        t = echo(s, 100)
        for i in range(100):
            reply, replier = c.send(Message(7, i), s.pid)
            assert (reply.code, reply[1], replier) == (7, i + 1, s.pid)
        t.join(10)
        assert not t.is_alive()


def test_segments_are_python_buffers_used_in_place():
    with Kernel.start("127.0.0.1:0") as k:
        s, c = k.create_process(), k.create_process()
        t = echo(s, 2, bytearray(64))
        seg = bytearray(b"hello world")
        reply, _, written = c.send_segment(Message(1, 0), s.pid, seg)
        assert (reply[1], written) == (1, 11)
        assert seg == b"dlrow olleh"
        view = memoryview(bytearray(b"abc"))
        c.send_segment(Message(1, 5), s.pid, view)
        assert bytes(view) == b"cba"
        t.join(10)


def test_move_to_and_move_from():
    with Kernel.start("127.0.0.1:0") as k:
        s, c = k.create_process(), k.create_process()

        def serve():
            msg, who = s.receive()
            back = bytearray(4)
            assert s.move_from(who.sender, back, 2) == 4
            assert s.move_to(who.sender, back[::-1], 0) == 4
            s.reply(msg, who.sender)

        t = threading.Thread(target=serve)
        t.start()
        seg = bytearray(b"..wxyz")
        c.send_segment(Message(2), s.pid, seg)
        t.join(10)
        assert seg == b"zyxwyz"


def test_names_and_errors_are_pythonic():
    with Kernel.start("127.0.0.1:0") as k:
        p = k.create_process()
        p.register("py-test-service")
        assert p.lookup("py-test-service") == p.pid
        assert p.lookup("nobody-registered-this") is None
        assert vkernel.service_id("py-test-service") > 0
        with pytest.raises(vkernel.NotAwaitingReply) as e:
            p.reply(Message(), p.pid)
        assert e.value.args[1] == 3
        with pytest.raises(vkernel.NoSuchProcess):
            p.send(Message(1), (k.host_id << 16) | 0x7777)
        # Writing into a read-only segment: the mover gets AccessDenied.
        q = k.create_process()
        seen = []

        def serve():
            _, who = q.receive()
            try:
                q.move_to(who.sender, b"x")
            except vkernel.AccessDenied as e:
                seen.append(e.args[1])
            finally:
                q.reply(Message(), who.sender)

        t = threading.Thread(target=serve)
        t.start()
        p.send_segment(Message(1), q.pid, b"read only", access="r")
        t.join(10)
        assert seen == [4]
        with pytest.raises(ValueError):
            p.send_segment(Message(1), q.pid, b"immutable", access="w")
        with pytest.raises(ValueError):
            Message(1, 2, 3, 4, 5, 6, 7, 8, 9)
    with pytest.raises(vkernel.HostLost):
        k.create_process()


def test_peers_may_be_names():
    # A name stands for every address it resolves to (the hosts file here).
    with Kernel.start("127.0.0.1:0", peers=["localhost:9", "127.0.0.1:9"]) as k:
        assert k.host_id > 0
    with pytest.raises(ValueError, match="has no port"):
        Kernel.start("127.0.0.1:0", peers=["localhost"])


def test_a_deadline_raises():
    with Kernel.start("127.0.0.1:0") as k:
        s, c = k.create_process(), k.create_process()
        t = threading.Thread(target=s.receive, daemon=True)
        t.start()
        with pytest.raises(vkernel.DeadlineExceeded) as e:
            c.send(Message(1), s.pid, timeout=0.1)
    # A timeout as Python code expects one, still a vkernel error with
    # its code and pid, and pickled whole.
    assert isinstance(e.value, TimeoutError)
    assert isinstance(e.value, vkernel.VkernelError)
    assert (e.value.code, e.value.pid) == (17, s.pid)
    assert str(e.value) == e.value.args[0] and "deadline" in str(e.value)
    import pickle

    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is vkernel.DeadlineExceeded
    assert (again.code, again.pid, str(again)) == (17, s.pid, str(e.value))


def test_the_gil_is_released_while_blocked():
    with Kernel.start("127.0.0.1:0") as k:
        s = k.create_process()
        ended = []

        def wait():
            try:
                s.receive()
            except vkernel.HostLost:
                ended.append("closed")

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        # The receiver blocks in the kernel; this thread still runs Python.
        count = sum(1 for _ in range(200_000))
        assert count == 200_000 and t.is_alive()
    # Closing the kernel ends the blocked Receive with HostLost.
    t.join(10)
    assert ended == ["closed"]


def test_two_python_programs_attached_to_one_machine_host():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "host.sock")
        with Kernel.start("127.0.0.1:0") as host, host.serve_attach(path) as srv:
            server_code = textwrap.dedent(
                f"""
                import vkernel
                with vkernel.Kernel.attach({path!r}) as k:
                    p = k.create_process()
                    p.register("py-attached-echo")
                    print("ready", flush=True)
                    for _ in range(500):
                        msg, who = p.receive()
                        msg[1] += 1
                        p.reply(msg, who.sender)
                """
            )
            server = subprocess.Popen(
                [sys.executable, "-c", server_code], stdout=subprocess.PIPE, text=True
            )
            assert server.stdout.readline().strip() == "ready"
            with Kernel.attach(path) as k:
                assert k.attached and k.host_id == host.host_id
                c = k.create_process()
                to = c.lookup("py-attached-echo")
                for i in range(500):
                    reply, _ = c.send(Message(9, i), to)
                    assert reply[1] == i + 1
            assert server.wait(30) == 0
            assert srv.attached >= 0


def test_the_example_runs():
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, os.path.join(here, "..", "examples", "echo.py"), "2000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2000 exchanges: median"), out.stdout
    assert "'segment bytes'" in out.stdout


def real_errors():
    """One error of each kind, raised by real calls: (exception, code, pid)."""
    got = []

    def catch(f, *a, **kw):
        try:
            f(*a, **kw)
        except vkernel.VkernelError as e:
            return e
        raise AssertionError(f"{f} raised nothing")

    with Kernel.start("127.0.0.1:0") as k:
        p, q = k.create_process(), k.create_process()
        gone = (k.host_id << 16) | 0x7777
        got.append((catch(p.send, Message(1), gone), 1, gone))
        got.append((catch(p.reply, Message(), q.pid), 3, q.pid))
        t = threading.Thread(target=q.receive, daemon=True)
        t.start()
        got.append((catch(p.send, Message(1), q.pid, timeout=0.05), 17, q.pid))
        # A read-only segment: MoveTo into it is AccessDenied.
        r = k.create_process()

        def serve():
            _, who = r.receive()
            got.append((catch(r.move_to, who.sender, b"x"), 4, who.sender))
            r.reply(Message(), who.sender)

        t = threading.Thread(target=serve)
        t.start()
        p.send_segment(Message(1), r.pid, b"ro", access="r")
        t.join(10)
    got.append((catch(k.create_process), 18, 0))
    # A start-up failure: no IpcError, so code 0.
    got.append((catch(Kernel.attach, "/nonexistent/vkernel-host.sock"), 0, 0))
    return got


def test_errors_are_vkernels_with_code_and_pid_and_pickle():
    import pickle

    kinds = {
        1: vkernel.NoSuchProcess,
        3: vkernel.NotAwaitingReply,
        4: vkernel.AccessDenied,
        17: vkernel.DeadlineExceeded,
        18: vkernel.HostLost,
        0: vkernel.VkernelError,
    }
    seen = set()
    for e, code, pid in real_errors():
        assert type(e) is kinds[code], (e, code)
        assert (e.code, e.pid) == (code, pid), e
        assert type(e).__module__ == "vkernel"
        # The same class from the package and the extension module.
        assert getattr(vkernel, type(e).__name__) is getattr(vkernel._vkernel, type(e).__name__)
        assert str(e) == e.args[0] and str(e)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e)
        assert (again.code, again.pid, str(again), again.args) == (code, pid, str(e), e.args)
        assert isinstance(again, vkernel.VkernelError)
        seen.add(type(e))
    assert seen == set(kinds.values())
    assert issubclass(vkernel.DeadlineExceeded, TimeoutError)
    # Made by Python code too (say, a server mirroring a failure).
    for cls in kinds.values():
        e = cls("made here", 5, 0x10002)
        again = pickle.loads(pickle.dumps(e))
        assert (type(again), again.code, again.pid, str(again)) == (cls, 5, 0x10002, "made here")
        bare = cls("no code")
        assert (bare.code, bare.pid) == (0, 0)


def test_the_module_has_its_packages_version():
    import importlib.metadata
    import pathlib
    import tomllib

    assert vkernel.__version__ == importlib.metadata.version("vkernel")
    # The package takes its version from the crate's (pyproject: dynamic).
    cargo = pathlib.Path(__file__).resolve().parents[1] / "Cargo.toml"
    with cargo.open("rb") as f:
        assert vkernel.__version__ == tomllib.load(f)["package"]["version"]
