"""A remote MCP server on the official Python SDK 2.x's `MCPServer`, served over the deprecated
2024-11-05 HTTP+SSE transport only (the SDK's `sse_app`: `SseServerTransport`, run by uvicorn),
for the gateway's remote-plugin tests. There is no Streamable HTTP endpoint.

  GET  /sse         - the event stream; its first event is `endpoint`, whose data is the path
                      to POST to: `/messages/?session_id=<32 hex digits>`. The server's
                      messages (responses, its own requests) come as `event: message`.
  POST /messages/?session_id=... - one JSON-RPC message; answered `202 Accepted` (the reply
                      comes on the stream); 404 for an unknown session, 400 without one.

The SDK's DNS-rebinding protection is on (it is for an app made for host 127.0.0.1): the Host
header must be `127.0.0.1:<port>`, `localhost:<port>` or `[::1]:<port>` (else 421), an Origin,
if any, one of those (else 403), and a POST's Content-Type application/json (else 400).

Tools:
  echo(text)              - "echo: <text>"
  ask_sampling(prompt)    - `session.create_message` on the session's back-channel (the SSE
                            stream); "LLM response: <the model's text>"

Run: python remote_sse_server.py [--port N]
  --port N    port on 127.0.0.1 (default 0: any free port)
Once listening it prints one line, `LISTENING <port>`, to stdout; its logs go to stderr.
"""

import argparse
import asyncio
import socket
import sys
import warnings

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning

# Sampling is deprecated at 2026-07-28; this server uses it on purpose, in the legacy era.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

mcp = MCPServer("python-remote-sse-fixture", version="1.0.0", log_level="WARNING")


@mcp.tool(description="Echoes the text")
def echo(text: str) -> str:
    return f"echo: {text}"


@mcp.tool(description="Asks the client's model")
async def ask_sampling(prompt: str, ctx: Context) -> str:
    message = types.SamplingMessage(role="user", content=types.TextContent(text=prompt))
    r = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
    return f"LLM response: {r.content.text}"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    app = mcp.sse_app(sse_path="/sse", message_path="/messages/", host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            sys.exit("remote_sse_server: uvicorn did not start")
        await asyncio.sleep(0.01)
    print(f"LISTENING {port}", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main())
