"""A free TCP port on the loopback interface, for the local servers tests start, and the
addresses a process listens on."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(process) -> set[tuple[str, int]]:  # noqa: ANN001 - a psutil.Process
    """The (address, port) of every TCP socket the process listens on."""
    import psutil

    return {
        (connection.laddr.ip, connection.laddr.port)
        for connection in process.net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN
    }
