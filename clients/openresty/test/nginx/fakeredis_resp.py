"""A scripted RESP server on a free loopback port: each command goes to
`handler(args) -> bytes` (the raw reply). For what a real Redis never
answers: replies of the wrong shape, ASK redirects."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*items: bytes) -> bytes:
    return b"*%d\r\n" % len(items) + b"".join(items)


def integer(n: int) -> bytes:
    return b":%d\r\n" % n


class FakeRedis:
    def __init__(self, handler: Callable[[list[bytes]], bytes]) -> None:
        self.handler = handler
        self.commands: list[list[bytes]] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._closed = False
        self._conns: list[socket.socket] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self._closed:
                conn.close()
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while True:
                args = self._read(f)
                if args is None:
                    return
                self.commands.append(args)
                conn.sendall(self.handler(args))
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _read(f) -> list[bytes] | None:  # type: ignore[no-untyped-def]
        line = f.readline()
        if not line:
            return None
        n = int(line[1:])
        args = []
        for _ in range(n):
            size = int(f.readline()[1:])
            args.append(f.read(size + 2)[:-2])
        return args

    def close(self) -> None:
        """Stops listening and serving before it returns: a thread still in
        accept() when its socket's descriptor is closed could otherwise take
        a later server's connections (the number is reused)."""
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        except OSError:
            pass
        self._acceptor.join(5)
        self.sock.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
