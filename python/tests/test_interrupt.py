"""Ctrl-C (SIGINT) ends a blocking call of the main thread: a real child
program blocks in a call, gets SIGINT, and must raise KeyboardInterrupt
from that call within a bound, leaving its processes usable or cleanly
failed, and exit as an uncaught KeyboardInterrupt does."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

# The child: argv = (kernel, call). Prints "blocking" just before the
# call, then what it saw; re-raises the KeyboardInterrupt at the end.
CHILD = r"""
import os, signal, sys, tempfile, threading, traceback
from vkernel import Kernel, Message, VkernelError

# (A child of a shell that ignores SIGINT would inherit that.)
signal.signal(signal.SIGINT, signal.default_int_handler)
how, call = sys.argv[1], sys.argv[2]
if how == "attached":
    path = os.path.join(tempfile.mkdtemp(), "host.sock")
    host = Kernel.start("127.0.0.1:0")
    srv = host.serve_attach(path)
    # Server and client in two attachments, as two programs would be.
    k, k2 = Kernel.attach(path), Kernel.attach(path)
else:
    k = k2 = Kernel.start("127.0.0.1:0")
s, c = k2.create_process(), k.create_process()


def blocked():
    if call == "receive":
        s.receive(bytearray(16))
    elif call == "send":
        # Nobody receives: the Send waits for ever.
        c.send(Message(1), s.pid)
    elif call == "received":
        # Received, never answered.
        threading.Thread(target=s.receive, daemon=True).start()
        c.send(Message(1), s.pid)


def ask(p, msg):
    t = threading.Thread(target=p.send, args=(msg, s.pid))
    t.start()
    return t


print("blocking", flush=True)
try:
    blocked()
    print("returned", flush=True)
except KeyboardInterrupt:
    last = traceback.extract_tb(sys.exc_info()[2])[-1]
    print("interrupted in", last.name, last.line, flush=True)
    if call == "receive":
        # The process still works, and no wake-up shows.
        t = ask(c, Message(5, 6))
        msg, who = s.receive()
        print("usable", msg.code, msg[1], who.sender == c.pid, flush=True)
        s.reply(msg, who.sender)
    else:
        try:
            c.send(Message(2), s.pid)
        except VkernelError as e:
            print("failed cleanly", e.code, e.pid == c.pid, flush=True)
        # The server serves others; the abandoned request is not queued.
        c2 = k.create_process()
        t = ask(c2, Message(7))
        msg, who = s.receive()
        print("server usable", msg.code, who.sender == c2.pid, flush=True)
        s.reply(msg, who.sender)
    # (A thread still in a call while the interpreter shuts down could
    # not take the GIL back.)
    t.join()
    raise
"""


def start(args, bound):
    """Starts a child program in its own session, and a watchdog that
    kills the session (the child and any child of its) after `bound`
    seconds: a child the signal does not end fails the test, not hangs it."""
    p = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    watchdog = threading.Timer(bound, kill_session, args=(p,))
    watchdog.start()
    return p, watchdog


def kill_session(p):
    # (Only while the child is unreaped: its group id is still its own.)
    if p.returncode is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop(p, watchdog):
    """Ends what `start` began."""
    watchdog.cancel()
    kill_session(p)
    p.wait()


def run_child(script, args, bound=10.0):
    """Runs CHILD (written to `script`, so tracebacks show its lines),
    sends SIGINT once it blocks; returns (stdout lines, stderr, return
    code, seconds from SIGINT to the child's report)."""
    script.write_text(CHILD)
    p, watchdog = start([str(script), *args], bound)
    try:
        assert p.stdout.readline().strip() == "blocking"
        # Long past the few microseconds before the call blocks.
        time.sleep(0.3)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        first = p.stdout.readline()
        took = time.monotonic() - sent
        # (Not communicate(): it would miss what readline buffered.)
        p.wait()
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        stop(p, watchdog)
    return [first.strip()] + out.splitlines(), err, p.returncode, took


@pytest.mark.parametrize("how", ["embedded", "attached"])
@pytest.mark.parametrize("call", ["receive", "send", "received"])
def test_ctrl_c_ends_a_blocked_call(how, call, tmp_path):
    lines, err, rc, took = run_child(tmp_path / "child.py", [how, call])
    print(f"{how} {call}: reported {took * 1000:.1f} ms after SIGINT")
    assert lines[0].startswith("interrupted in blocked"), (lines, err)
    assert (".receive(" if call == "receive" else ".send(") in lines[0]
    # A bound, not a speed measurement: unwoken, the call never returns.
    assert took < 5.0
    if call == "receive":
        assert lines[1] == "usable 5 6 True", (lines, err)
    else:
        assert lines[1] == "failed cleanly 14 True", (lines, err)
        assert lines[2] == "server usable 7 True", (lines, err)
    # Exits as an uncaught KeyboardInterrupt does (by SIGINT, since 3.8).
    assert rc == -signal.SIGINT, (rc, err)
    assert err.rstrip().endswith("KeyboardInterrupt"), err


# A handler that does not raise runs while the call waits. A Receive then
# goes on (as Python retries a system call, PEP 475); a Send, whose
# process Ctrl-C destroyed, fails with code 14.
CHILD_HANDLER = r"""
import signal, threading
from vkernel import Kernel, Message, VkernelError

with Kernel.start("127.0.0.1:0") as k:
    s, c = k.create_process(), k.create_process()
    ran = threading.Event()

    def handler(sig, frame):
        print("handler ran", flush=True)
        ran.set()

    signal.signal(signal.SIGINT, handler)
    # Sends only once the handler ran, so the Receive waited until then.
    t = threading.Thread(target=lambda: ran.wait() and c.send(Message(3), s.pid))
    t.start()
    print("blocking", flush=True)
    msg, who = s.receive()
    print("received", msg.code, who.sender == c.pid, flush=True)
    s.reply(msg, who.sender)
    t.join()
    print("blocking", flush=True)
    try:
        c.send(Message(4), s.pid)
    except VkernelError as e:
        print("send failed", e.code, flush=True)
"""


def test_a_handler_that_does_not_raise_runs_and_the_call_ends_as_told():
    p, watchdog = start(["-c", CHILD_HANDLER], 20)
    lines = []
    try:
        for _ in range(2):
            assert p.stdout.readline().strip() == "blocking"
            time.sleep(0.3)
            p.send_signal(signal.SIGINT)
            lines += [p.stdout.readline().strip() for _ in range(2)]
        p.wait()
    finally:
        stop(p, watchdog)
    err = p.stderr.read()
    assert lines == ["handler ran", "received 3 True", "handler ran", "send failed 14"], (
        lines,
        err,
    )
    assert p.returncode == 0, err


# Fork: the child inherits the handler but not the watcher thread, nor
# may its SIGINT reach the parent's (whose Send would be destroyed).
CHILD_FORK = r"""
import os, signal, threading
from vkernel import Kernel, Message

signal.signal(signal.SIGINT, signal.default_int_handler)
k = Kernel.start("127.0.0.1:0")
s, c = k.create_process(), k.create_process()
# A main-thread call first: the handler and the watcher are in place.
def serve_one():
    msg, who = s.receive()
    s.reply(msg, who.sender)
t = threading.Thread(target=serve_one)
t.start()
c.send(Message(1), s.pid)
t.join()
pid = os.fork()
if pid == 0:
    # (Only by os._exit: the parent's kernel has no threads here to stop.)
    try:
        k2 = Kernel.start("127.0.0.1:0")
        p = k2.create_process()
        print("child blocking", os.getpid(), flush=True)
        p.receive()
    except KeyboardInterrupt:
        print("child interrupted", flush=True)
        os._exit(7)
    finally:
        os._exit(1)


def answer():
    msg, who = s.receive()
    _, status = os.waitpid(pid, 0)
    s.reply(Message(os.waitstatus_to_exitcode(status)), who.sender)


t = threading.Thread(target=answer)
t.start()
reply, _ = c.send(Message(2), s.pid)
t.join()
print("parent's send answered", reply.code, flush=True)
"""


def test_ctrl_c_in_a_forked_child_ends_its_call_and_not_the_parents():
    p, watchdog = start(["-c", CHILD_FORK], 20)
    try:
        first = p.stdout.readline().split()
        assert first[:2] == ["child", "blocking"], (first, p.stderr.read())
        time.sleep(0.3)
        os.kill(int(first[2]), signal.SIGINT)
        p.wait()
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        stop(p, watchdog)
    assert out.splitlines() == ["child interrupted", "parent's send answered 7"], (out, err)
    assert p.returncode == 0, err
