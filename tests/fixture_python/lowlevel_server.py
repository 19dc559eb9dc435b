"""A stdio MCP server on the official Python SDK 2.x's low-level `Server`, for the gateway's
tests (tests/python_plugins.rs). Like every server on that SDK it speaks both eras: it answers
`server/discover` as a 2026-07-28 server and `initialize` as a legacy one, whichever comes
first deciding the era of the process. It uses what only the legacy era gives a server: its
own requests to the client on the session's back-channel, and `resources/subscribe`.

Tools:
  test_sampling(prompt)   - `session.create_message`; "LLM response: <the model's text>"
  test_elicitation(message) - `session.elicit_form` asking for username and email;
                            "User response: action=<action> content=<content as JSON>"
  test_elicitation_sep1034_defaults, test_elicitation_sep1330_enums - the conformance suite's
                            elicitations (defaults of every primitive type; the five enum forms)
  touch_resource(uri)     - sends `notifications/resources/updated` for `uri` if it is
                            subscribed; "subscribed" or "not subscribed"
  wait_cancel(seconds)    - sleeps, noting a cancellation; "not cancelled"
  was_cancelled()         - "cancelled" once a wait_cancel was cancelled, else "not cancelled"
  add_tool(name)          - lists one more tool, `name`, and sends `notifications/tools/list_changed`
  say(text)               - logs `text` at level info (`notifications/message`, logger "fixture")
                            on the call's stream; "said"
Resource: `test://watched-resource` (text), subscribable.

Run: python lowlevel_server.py [--port N]
  without --port it speaks stdio; with it, Streamable HTTP (legacy era: sessions, a GET stream)
  on 127.0.0.1:N (0: any free port) at /mcp, printing `LISTENING <port>` once it listens
"""

import argparse
import json
import socket
import warnings

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning

# Sampling is deprecated at 2026-07-28; this server uses it on purpose, in the legacy era.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

WATCHED = "test://watched-resource"
subscribed: set[str] = set()
cancelled: list[bool] = []

SEP1034_DEFAULTS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
}


def titled(prefix: str) -> list[dict]:
    return [{"const": f"value{i}", "title": f"{prefix} {n}"} for i, n in ((1, "One"), (2, "Two"), (3, "Three"))]


SEP1330_ENUMS = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
        "titledSingle": {"type": "string", "oneOf": titled("Option")},
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
        "titledMulti": {"type": "array", "items": {"anyOf": titled("Choice")}},
    },
}

USER = {
    "type": "object",
    "properties": {
        "username": {"type": "string", "description": "User's response"},
        "email": {"type": "string", "description": "User's email address"},
    },
    "required": ["username", "email"],
}


def tool(name: str, description: str, properties: dict | None = None) -> types.Tool:
    schema = {"type": "object", "properties": properties or {}}
    if properties:
        schema["required"] = list(properties)
    return types.Tool(name=name, description=description, input_schema=schema)


TOOLS = [
    tool("test_sampling", "Asks the client's model", {"prompt": {"type": "string"}}),
    tool("test_elicitation", "Asks the user for a username and an email", {"message": {"type": "string"}}),
    tool("test_elicitation_sep1034_defaults", "An elicitation with defaults"),
    tool("test_elicitation_sep1330_enums", "An elicitation with the five enum forms"),
    tool("touch_resource", "Says a subscribed resource changed", {"uri": {"type": "string"}}),
    tool("wait_cancel", "Waits, noting a cancellation", {"seconds": {"type": "number"}}),
    tool("was_cancelled", "Whether a wait_cancel was cancelled"),
    tool("add_tool", "Lists one more tool", {"name": {"type": "string"}}),
    tool("say", "Logs the text", {"text": {"type": "string"}}),
]


def text(t: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=t)])


def answered(r: types.ElicitResult) -> str:
    return f"action={r.action} content={json.dumps(r.content, sort_keys=True)}"


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    session, related = ctx.session, ctx.request_id
    match params.name:
        case "test_sampling":
            prompt = types.SamplingMessage(role="user", content=types.TextContent(text=args["prompt"]))
            r = await session.create_message([prompt], max_tokens=100, related_request_id=related)
            return text(f"LLM response: {r.content.text}")
        case "test_elicitation":
            r = await session.elicit_form(args["message"], USER, related_request_id=related)
            return text(f"User response: {answered(r)}")
        case "test_elicitation_sep1034_defaults":
            r = await session.elicit_form("Please review the form's defaults", SEP1034_DEFAULTS, related)
            return text(f"Elicitation completed: {answered(r)}")
        case "test_elicitation_sep1330_enums":
            r = await session.elicit_form("Please select options from the enum fields", SEP1330_ENUMS, related)
            return text(f"Elicitation completed: {answered(r)}")
        case "touch_resource":
            if args["uri"] not in subscribed:
                return text("not subscribed")
            await session.send_resource_updated(args["uri"])
            return text("subscribed")
        case "wait_cancel":
            try:
                await anyio.sleep(float(args["seconds"]))
            except anyio.get_cancelled_exc_class():
                cancelled.append(True)
                raise
            return text("not cancelled")
        case "was_cancelled":
            return text("cancelled" if cancelled else "not cancelled")
        case "say":
            await session.send_log_message("info", args["text"], logger="fixture", related_request_id=related)
            return text("said")
        case "add_tool":
            TOOLS.append(tool(args["name"], "Added while running"))
            await session.send_tool_list_changed()
            return text("added")
    raise ValueError(f"unknown tool {params.name}")


async def list_resources(ctx, params) -> types.ListResourcesResult:
    return types.ListResourcesResult(
        resources=[types.Resource(uri=WATCHED, name="watched", mime_type="text/plain")]
    )


async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=params.uri, mime_type="text/plain", text="watched content")]
    )


async def subscribe(ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscribed.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscribed.discard(str(params.uri))
    return types.EmptyResult()


server = Server(
    "python-lowlevel-fixture",
    version="1.0.0",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
)


async def stdio() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def http(port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    served = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: served.serve(sockets=[sock]))
        while not served.started:
            await anyio.sleep(0.01)
        print(f"LISTENING {sock.getsockname()[1]}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int)
    port = parser.parse_args().port
    if port is None:
        anyio.run(stdio)
    else:
        anyio.run(http, port)
