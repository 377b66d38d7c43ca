"""A worker process's metrics listener: the process registry over HTTP, for processes with no HTTP server."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from prometheus_client import start_http_server

log = logging.getLogger("switchboard.metrics")


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[int | None]:
    """Serve the process registry on host:port (any path) for the life of the block; port 0 serves nothing.

    prometheus-client's own threaded server: the worker process has no HTTP server of its own, and a scrape runs
    in that thread, never on the worker's event loop. Yields the bound port (None when off).
    """
    if not port:
        yield None
        return
    server, thread = start_http_server(port, addr=host)
    log.info("metrics listening on %s:%d", host, server.server_port)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
