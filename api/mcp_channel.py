"""The one reach into the MCP SDK's internals: the connection behind a request's session.

Rings reach an MCP session as notifications outside any request, on its connection's standalone channel, and
the session is forgotten when its connection ends (``Connection.exit_stack``). ``Connection`` is public in the
SDK, but a handler is given only the per-request ``ServerSession`` proxy, which keeps the connection private; the
SDK offers no public way to reach it (mcp 2.3). So the doorbell over MCP cannot exist without this one lookup.

The behaviour relied on is tested end to end: a ring reaches an MCP client's GET stream, and the session is
forgotten once its client ends it or its endpoint is revoked (tests/api/test_doorbell.py,
tests/api/test_doorbell_resilience.py). Were a release of the SDK to move the connection, this answers None and
the session is served without rings (logged), never wrongly.
"""

from __future__ import annotations

from mcp.server.connection import Connection
from mcp.server.session import ServerSession


def standalone_connection(session: ServerSession) -> Connection | None:
    """The connection a request's session proxy serves, or None where the SDK keeps it elsewhere."""
    connection = getattr(session, "_connection", None)
    return connection if isinstance(connection, Connection) else None
