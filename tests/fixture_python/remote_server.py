"""A remote MCP server on the official Python SDK 2.x's `MCPServer`, served over Streamable HTTP
(the SDK's own `streamable_http_app`, run by uvicorn), for the gateway's remote-plugin tests.
Like every server on that SDK it speaks both eras on the one endpoint: a POST whose
`MCP-Protocol-Version` header names 2026-07-28 is served statelessly (one request, one
response, no `Mcp-Session-Id`; `server/discover` instead of `initialize`), anything else goes
to the legacy, session-based transport (`initialize`, `Mcp-Session-Id`, GET stream, DELETE).

The SDK's DNS-rebinding protection is on (it is for an app made for host 127.0.0.1): the Host
header must be `127.0.0.1:<port>`, `localhost:<port>` or `[::1]:<port>` (else 421), an Origin,
if any, one of those (else 403), and a POST's Content-Type application/json (else 400).

Tools:
  echo(text)              - "echo: <text>"
  add(a, b)               - integers; the sum as text (and `{"result": <sum>}` as structured content)
  slow_progress(steps)    - sleeps 0.1 s a step, sending `notifications/progress` (progress=i,
                            total=steps, message "step i") when the call carries a progressToken;
                            "done <steps> steps"
Resource: `test://remote/hello` (text/plain) - "Hello from the remote server".
Prompt: greet(name)       - one user message, "Hello, <name>!"

Run: python remote_server.py [--port N] [--mount /mcp] [--event-store] [--json-response]
  --port N         port on 127.0.0.1 (default 0: any free port)
  --mount PATH     the endpoint's path (default /mcp)
  --event-store    keep an in-memory event store (legacy era): SSE events get ids, a priming
                   event opens each POST stream, and a GET with Last-Event-ID replays a stream
  --json-response  answer POSTs with application/json rather than an SSE stream
Once listening it prints one line, `LISTENING <port>`, to stdout; its logs go to stderr.
"""

import argparse
import asyncio
import socket
import sys
from itertools import count

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

mcp = MCPServer("python-remote-fixture", version="1.0.0", log_level="WARNING")


@mcp.tool(description="Echoes the text")
def echo(text: str) -> str:
    return f"echo: {text}"


@mcp.tool(description="Adds two integers")
def add(a: int, b: int) -> int:
    return a + b


@mcp.tool(description="Takes a while, reporting progress at each step")
async def slow_progress(steps: int, ctx: Context) -> str:
    for i in range(1, steps + 1):
        await asyncio.sleep(0.1)
        await ctx.report_progress(i, steps, f"step {i}")
    return f"done {steps} steps"


@mcp.resource("test://remote/hello", mime_type="text/plain")
def hello() -> str:
    return "Hello from the remote server"


@mcp.prompt(description="Greets someone")
def greet(name: str) -> str:
    return f"Hello, {name}!"


class MemoryEventStore(EventStore):
    """Every event of every stream, in order; a replay sends the later events of the same stream."""

    def __init__(self) -> None:
        self.events: list[tuple[EventId, StreamId, JSONRPCMessage | None]] = []
        self.ids = count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(next(self.ids))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        at = next((i for i, (e, _, _) in enumerate(self.events) if e == last_event_id), None)
        if at is None:
            return None
        stream_id = self.events[at][1]
        for event_id, sid, message in self.events[at + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mount", default="/mcp")
    parser.add_argument("--event-store", action="store_true")
    parser.add_argument("--json-response", action="store_true")
    args = parser.parse_args()

    app = mcp.streamable_http_app(
        streamable_http_path=args.mount,
        json_response=args.json_response,
        event_store=MemoryEventStore() if args.event_store else None,
        host="127.0.0.1",
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            sys.exit("remote_server: uvicorn did not start")
        await asyncio.sleep(0.01)
    print(f"LISTENING {port}", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main())
