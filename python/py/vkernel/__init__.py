"""vkernel: V's transparent message passing from Python.

Processes exchange 32-byte messages by synchronous ``send``/``receive``/
``reply``, and move bulk data in place with segments and
``move_to``/``move_from``, locally or across machines::

    import threading, vkernel

    with vkernel.Kernel.start() as k:
        server, client = k.create_process(), k.create_process()

        def serve():
            msg, who = server.receive()
            server.reply(vkernel.Message(msg.code, msg[1] + 1), who.sender)

        threading.Thread(target=serve).start()
        reply, replier = client.send(vkernel.Message(1, 41), server.pid)
        assert reply[1] == 42

Every blocking call releases the GIL. Segments are any contiguous Python
buffer (``bytes`` for reading, ``bytearray`` or a writable ``memoryview``
for writing) and are used in place, without a copy into Python objects.

Ctrl-C (SIGINT) ends a call the main thread is blocked in, and Python's
handler runs (by default raising ``KeyboardInterrupt``). A ``receive``
stays usable: if the handler raises nothing it goes on waiting, and no
message is lost. A call that cannot be withdrawn (``send`` awaiting its
reply, a move, a lookup) ends by destroying its process, as V ends a
blocked Send (its server's Reply fails), and the ``Process`` fails every
later call with ``VkernelError`` code 14.

Failures raise ``VkernelError`` or a subclass (``NoSuchProcess``,
``NotAwaitingReply``, ``DeadlineExceeded``, also a ``TimeoutError``,
``HostLost``, ``AccessDenied``), with ``.code`` (the error's number, 0 for
start-up failures) and ``.pid`` (the process it names, 0 if none); they
pickle whole.
"""

from ._vkernel import (
    AccessDenied,
    AttachServer,
    DeadlineExceeded,
    HostLost,
    Incoming,
    Kernel,
    Message,
    NoSuchProcess,
    NotAwaitingReply,
    Process,
    VkernelError,
    __version__,
    service_id,
)

# The exceptions are the `vkernel` module's (so they pickle by name);
# their arguments are (message, code, pid): the IpcError code (0 for
# start-up failures) and the process it names.
VkernelError.code = property(lambda e: e.args[1] if len(e.args) > 1 else 0, doc="The IpcError code.")
VkernelError.pid = property(lambda e: e.args[2] if len(e.args) > 2 else 0, doc="The process it names.")
VkernelError.__str__ = lambda e: str(e.args[0]) if e.args else ""

__all__ = [
    "AccessDenied",
    "AttachServer",
    "DeadlineExceeded",
    "HostLost",
    "Incoming",
    "Kernel",
    "Message",
    "NoSuchProcess",
    "NotAwaitingReply",
    "Process",
    "VkernelError",
    "__version__",
    "service_id",
]
