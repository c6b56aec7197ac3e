"""A TCP proxy on 127.0.0.1 in front of a database server, whose link can be cut,
blackholed or slowed; the server itself is never touched.

Used by the fault tests (``tests/test_faults.py``) and the fault campaign
(``benchmarks/campaign.py``), which gives each server a proxy of its own.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import suppress


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``; ``cut()``, ``slow()`` and ``restore()`` it.

    ``cut("refuse")`` is a server going down: every connection is closed and new ones
    are refused. ``cut("blackhole")`` is a network dropping packets: connections stay
    open but nothing gets through, and new ones are accepted and left waiting; after
    ``restore()`` the held bytes and the waiting connections go through. ``slow(delay)``
    holds each chunk of traffic ``delay`` seconds before passing it on (slow statements).
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.delay = 0.0
        self._mutex = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._stopped = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._waiting: list[socket.socket] = []
        self._mode = "open"
        # Bound to the port and never listening: while a cut has closed the listener, no
        # other socket (an outgoing connection's local port, say) can take the port, so
        # restore() can always listen on it again (both set SO_REUSEPORT).
        self._reserved = self._bind(0)
        self.port: int = self._reserved.getsockname()[1]
        self._listener: socket.socket | None = self._listen()
        self._acceptor = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._acceptor.start()

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        return sock

    def _listen(self) -> socket.socket:
        listener = self._bind(self.port)
        listener.listen(64)
        listener.settimeout(0.05)
        return listener

    def _accept(self) -> None:
        while not self._stopped.is_set():
            listener = self._listener
            if listener is None:
                self._stopped.wait(0.02)
                continue
            try:
                client, _address = listener.accept()
            except OSError:  # timeout, or closed by cut()
                continue
            client.settimeout(None)
            with self._mutex:
                if self._mode == "refuse":  # accepted just before the cut
                    client.close()
                    continue
                if self._mode == "blackhole":
                    self._waiting.append(client)
                    self._sockets.add(client)
                    continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self._close(client)
            return
        server.settimeout(None)
        with self._mutex:
            refused = self._mode == "refuse"  # cut while it connected
            if not refused:
                self._sockets.update((client, server))
        if refused:
            self._close(client)
            self._close(server)
            return
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                while not self._flowing.wait(0.05):  # blackholed: hold the bytes
                    if self._stopped.is_set():
                        return
                if self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source)
            self._close(sink)

    def _close(self, sock: socket.socket) -> None:
        with self._mutex:
            self._sockets.discard(sock)
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    def _close_all(self) -> None:
        with self._mutex:
            doomed = list(self._sockets)
            self._waiting = []
        for sock in doomed:
            self._close(sock)

    def cut(self, mode: str = "refuse") -> None:
        if mode == "refuse":
            with self._mutex:
                self._mode = mode
                listener, self._listener = self._listener, None
            if listener is not None:
                listener.close()
            self._close_all()
        elif mode == "blackhole":
            with self._mutex:
                self._mode = mode
            self._flowing.clear()
        else:
            raise ValueError(f"unknown cut mode {mode!r}")

    def slow(self, delay: float) -> None:
        self.delay = delay

    def restore(self) -> None:
        """Undo ``cut`` and ``slow``: the link works as before."""
        self.delay = 0.0
        with self._mutex:
            if self._listener is None:
                self._listener = self._listen()
            self._mode = "open"
            waiting, self._waiting = self._waiting, []
        self._flowing.set()
        for client in waiting:
            with self._mutex:
                self._sockets.discard(client)
            self._connect(client)

    def stop(self) -> None:
        self._stopped.set()
        self._flowing.set()
        with self._mutex:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._close_all()
        self._acceptor.join(5)
        self._reserved.close()
