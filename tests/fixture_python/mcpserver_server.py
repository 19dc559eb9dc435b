"""A stdio MCP server on the official Python SDK 2.x's `MCPServer` (the decorator API), for the
gateway's tests (tests/python_plugins.rs). Like every server on that SDK it speaks both eras,
the first request of the process deciding which; its tools use what only the legacy era gives
a server, requests to the client on the session's back-channel.

Tools:
  test_elicitation(message) - `ctx.elicit` with a pydantic model (username, email);
                            "User response: action=<action> username=<...> email=<...>"
  test_sampling(prompt)   - `ctx.session.create_message`; "LLM response: <the model's text>"
  echo(text)              - the text
Resource: `test://static-text` (text). `MCPServer` 2.3.0 serves no `resources/subscribe` of
its own (its subscriptions are `subscriptions/listen`'s): the subscribable resource is the
low-level fixture's.

Run: python mcpserver_server.py
"""

import warnings

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import BaseModel, Field

# Sampling is deprecated at 2026-07-28; this server uses it on purpose, in the legacy era.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

mcp = MCPServer("python-mcpserver-fixture", version="1.0.0")


class User(BaseModel):
    username: str = Field(description="User's response")
    email: str = Field(description="User's email address")


@mcp.tool(description="Asks the user for a username and an email")
async def test_elicitation(message: str, ctx: Context) -> str:
    r = await ctx.elicit(message, schema=User)
    if r.action != "accept":
        return f"User response: action={r.action}"
    return f"User response: action=accept username={r.data.username} email={r.data.email}"


@mcp.tool(description="Asks the client's model")
async def test_sampling(prompt: str, ctx: Context) -> str:
    message = types.SamplingMessage(role="user", content=types.TextContent(text=prompt))
    r = await ctx.session.create_message([message], max_tokens=100, related_request_id=ctx.request_id)
    return f"LLM response: {r.content.text}"


@mcp.tool(description="Echoes the text")
def echo(text: str) -> str:
    return text


@mcp.resource("test://static-text", mime_type="text/plain")
def static_text() -> str:
    return "This is the content of the static text resource."


if __name__ == "__main__":
    mcp.run()
