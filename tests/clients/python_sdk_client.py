"""A real MCP client, the official Python SDK (mcp 2.x), driven against the gateway by
tests/python_sdk.rs.

Usage: python_sdk_client.py MODE URL [ARGS...]
  fixture     - the gateway fronts tests/fixture: tools, resources, prompts, sampling,
                progress, cancellation, then DELETE on close
  thirdparty  - the gateway fronts @modelcontextprotocol/server-everything (npm) and
                mcp-server-time (PyPI), prefixed `everything__` and `time__`
  polling     - the gateway fronts tests/fixture and closes SSE connections mid-call
                (polling mode): calls must still complete
  modern      - a 2026-07-28 client (no session): tools, a resource, a prompt
  auto        - the same in the SDK's `auto` mode, which must end up modern
  modern_input - a 2026-07-28 client answering the fixture's elicitation and sampling (and a
                tool that asks twice) through InputRequiredResult, with its callbacks
  legacy_modern_plugin - a legacy client in front of tests/fixture_modern (a plugin of the
                2026-07-28 era only), answering its elicitation as a request on its stream
  listen      - a 2026-07-28 client's `Client.listen()` for tool list changes, while the
                client adds a plugin through the admin API (ARGS: the admin listener's
                address, its token, the fixture's path): the change must reach it
  python_plugins_legacy - a legacy client in front of the Python SDK fixtures
                (tests/fixture_python, plugins `low` and `high`): their elicitation and
                sampling as requests on its streams, a subscription to `low`'s watched resource
  python_plugins_modern - the same through a 2026-07-28 client: InputRequiredResults, and
                `Client.listen()` for the watched resource
  cluster     - URL is a load balancer in front of several replicas in cluster mode, in
                polling mode: tools, progress, sampling, a resource subscription and streams
                resumed, every request on whichever replica round-robin picks
Prints one JSON object with what it saw; exits non-zero on any failure.

The era: mcp 2.x's `Client` defaults to mode="auto", which first POSTs `server/discover` at
protocol 2026-07-28 and falls back to `initialize` when that fails (the gateway answers it
400: no session). mode="legacy" goes straight to the `initialize` handshake at 2025-11-25,
the era the gateway serves, so every test here uses it.
"""

import asyncio
import json
import sys
from contextlib import asynccontextmanager

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

# The SDK's own defaults for the HTTP client it would make (30 s, 300 s for a held stream).
TIMEOUTS = httpx2.Timeout(30.0, read=300.0)


class Wire:
    """Watches the client's HTTP exchanges: the SDK 2.x keeps the session id and its JSON-RPC
    request ids to itself, and the tests need both (the id to find the session's end in the
    gateway's log, a request id to cancel it by hand)."""

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.call_ids: dict[str, object] = {}

    async def on_request(self, request: httpx2.Request) -> None:
        if request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except ValueError:
            return
        if isinstance(body, dict) and body.get("method") == "tools/call":
            self.call_ids[body["params"]["name"]] = body["id"]

    async def on_response(self, response: httpx2.Response) -> None:
        if sid := response.headers.get("mcp-session-id"):
            self.session_id = sid

    @asynccontextmanager
    async def client(self, url: str, **kwargs):
        """A connected legacy-era client on `url` whose HTTP traffic this watches."""
        async with httpx2.AsyncClient(timeout=TIMEOUTS) as http:
            http.event_hooks = {"request": [self.on_request], "response": [self.on_response]}
            # cache=None: every call reaches the gateway (the SDK's response cache is a
            # 2026-07-28 feature, inert at 2025-11-25, but the tests count on the wire).
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="legacy", cache=None, **kwargs) as client:
                yield client


async def sampling(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    asked = params.messages[0].content.text
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text=f"sampled({asked})"),
        model="python-sdk-test",
    )


def text_of(result) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def fixture(url: str) -> dict:
    out: dict = {}
    wire = Wire()
    async with wire.client(url, sampling_callback=sampling) as client:
        out["session_id"] = wire.session_id
        out["protocol_version"] = client.protocol_version
        out["server_name"] = client.server_info.name
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        out["echo"] = text_of(await client.call_tool("echo", {"text": "hello from python"}))
        res = await client.read_resource("test://static-text")
        out["resource"] = res.contents[0].text
        prompt = await client.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
        out["prompt"] = prompt.messages[0].content.text
        out["sampling"] = text_of(await client.call_tool("test_sampling", {"prompt": "what is 2+2"}))

        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        done = await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        out["progress_result"] = text_of(done)
        out["progress"] = progress

        # Cancellation: start a slow call, wait for its first progress (it reached the
        # plugin), then send notifications/cancelled for its request id by hand, and see that
        # no answer comes before the call's own 3 s timeout.
        started = asyncio.Event()

        async def on_slow_progress(p: float, total: float | None, message: str | None) -> None:
            started.set()

        slow = asyncio.create_task(
            client.call_tool(
                "slow",
                {"ms": 60000},
                read_timeout_seconds=3,
                progress_callback=on_slow_progress,
            )
        )
        await asyncio.wait_for(started.wait(), 20)
        await client.session.send_notification(
            types.CancelledNotification(
                params=types.CancelledNotificationParams(request_id=wire.call_ids["slow"], reason="test cancels")
            )
        )
        try:
            await slow
            out["cancelled"] = "completed (unexpected)"
        except MCPError as e:
            out["cancelled"] = f"no response: {e.error.message}"
        out["after_cancel"] = text_of(await client.call_tool("echo", {"text": "still alive"}))
    return out


async def thirdparty(url: str) -> dict:
    out: dict = {}
    wire = Wire()
    async with wire.client(url) as client:
        out["session_id"] = wire.session_id
        tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        out["tools"] = sorted(names)
        out["echo"] = text_of(await client.call_tool("everything__echo", {"message": "through the gateway"}))
        now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
        out["time"] = json.loads(text_of(now))
        prompts = await client.list_prompts()
        out["prompts"] = sorted(p.name for p in prompts.prompts)
    return out


async def polling(url: str) -> dict:
    out: dict = {}
    async with Wire().client(url) as client:
        out["slow"] = text_of(await client.call_tool("slow", {"ms": 1500}))
        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        out["burst"] = text_of(await client.call_tool("burst", {"count": 300, "pause_us": 3000}))
        out["progress"] = text_of(
            await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        )
        out["progress_values"] = progress
    return out


async def cluster(url: str) -> dict:
    """Through a load balancer in front of several replicas, round-robin: every request may
    land on another replica than the one before."""
    out: dict = {}
    updated: list[str] = []
    got_update = asyncio.Event()

    async def on_message(message) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updated.append(str(root.params.uri))
            got_update.set()

    wire = Wire()
    async with wire.client(url, sampling_callback=sampling, message_handler=on_message) as client:
        out["session_id"] = wire.session_id
        tools = await client.list_tools()
        out["tools"] = len(tools.tools)
        out["echo"] = [
            text_of(await client.call_tool("echo", {"text": f"call {i}"})) for i in range(6)
        ]
        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        out["progress"] = progress
        out["sampling"] = text_of(await client.call_tool("test_sampling", {"prompt": "2+2"}))
        await client.subscribe_resource("test://static-text")
        await client.call_tool("touch_resource", {"uri": "test://static-text"})
        await asyncio.wait_for(got_update.wait(), 20)
        out["updated"] = updated
        # The gateways close streams mid-call (polling): the SDK resumes with Last-Event-ID,
        # through the load balancer, so at another replica than the one that opened it.
        out["slow"] = text_of(await client.call_tool("slow", {"ms": 1500}))
    return out


async def modern(url: str, mode: str = "2026-07-28") -> dict:
    """A client of the 2026-07-28 era (no session): pinned to it, or in `auto`, which probes
    `server/discover` first and must end up modern."""
    out: dict = {}
    async with httpx2.AsyncClient(timeout=TIMEOUTS) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, cache=None) as client:
            out["protocol_version"] = client.protocol_version
            tools = await client.list_tools()
            out["tools"] = len(tools.tools)
            out["echo"] = text_of(await client.call_tool("echo", {"text": "hello from a modern client"}))
            res = await client.read_resource("test://static-text")
            out["resource"] = res.contents[0].text
            prompt = await client.get_prompt("test_simple_prompt", {})
            out["prompt"] = prompt.messages[0].content.text
    return out


async def auto(url: str) -> dict:
    return await modern(url, "auto")


async def modern_input(url: str) -> dict:
    """A 2026-07-28 client whose elicitation and sampling callbacks answer what the legacy
    fixture asks: the gateway turns its requests into `InputRequiredResult`s, which the SDK
    resolves itself, retrying with the answers."""
    out: dict = {"asked": []}

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        out["asked"].append(params.message)
        if params.message.endswith("?") and "username" not in str(params.requested_schema):
            return types.ElicitResult(action="accept", content={"answer": f"re:{params.message}"})
        return types.ElicitResult(action="accept", content={"username": "python", "email": "py@example.com"})

    async def sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        out["asked"].append("sampling")
        return await sampling(context, params)

    async with httpx2.AsyncClient(timeout=TIMEOUTS) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(
            transport, mode="2026-07-28", cache=None, elicitation_callback=elicit, sampling_callback=sample
        ) as client:
            out["protocol_version"] = client.protocol_version
            out["elicitation"] = text_of(await client.call_tool("test_elicitation", {"message": "who are you"}))
            out["sampling"] = text_of(await client.call_tool("test_sampling", {"prompt": "what is 2+2"}))
            out["twice"] = text_of(await client.call_tool("ask_twice", {}))
    return out


async def legacy_modern_plugin(url: str) -> dict:
    """A legacy-era client (a session at 2025-11-25) in front of a modern-only plugin that
    asks for input with `InputRequiredResult`: the gateway asks this client with
    `elicitation/create` on the call's stream, and retries the plugin with the answer."""
    out: dict = {"asked": []}

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        out["asked"].append(params.message)
        return types.ElicitResult(action="accept", content={"name": "python"})

    async with Wire().client(url, elicitation_callback=elicit) as client:
        out["protocol_version"] = client.protocol_version
        out["ask_name"] = text_of(await client.call_tool("ask_name", {}))
        out["echo"] = text_of(await client.call_tool("echo", {"text": "after"}))
    return out


async def listen(url: str, admin: str, token: str, fixture_path: str) -> dict:
    """`Client.listen()` (subscriptions/listen) hears of a plugin added through the admin API."""
    out: dict = {}
    async with httpx2.AsyncClient(timeout=TIMEOUTS) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="2026-07-28", cache=None) as client:
            out["protocol_version"] = client.protocol_version
            async with client.listen(tools_list_changed=True) as sub:
                out["honored"] = sub.honored.model_dump(by_alias=True, exclude_none=True)
                added = await http.post(
                    f"http://{admin}/admin/plugins",
                    json={"name": "extra", "command": fixture_path, "args": ["--name", "extra"]},
                    headers={"authorization": f"Bearer {token}"},
                )
                out["admin_status"] = added.status_code
                event = await asyncio.wait_for(sub.__anext__(), 20)
                out["event"] = type(event).__name__
            # The new plugin's tools are there once it is ready.
            for _ in range(100):
                tools = await client.list_tools()
                names = sorted(t.name for t in tools.tools)
                if "extra__echo" in names:
                    break
                await asyncio.sleep(0.05)
            out["tools"] = [n for n in names if n.endswith("__echo")]
    return out


async def outcome(call) -> str:
    """A tool call's text, or its error's message: what the tests compare, either way."""
    try:
        return text_of(await call)
    except MCPError as e:
        return f"error: {e.error.message}"


async def python_plugins(client, out: dict) -> None:
    """Each Python SDK fixture's elicitation and sampling, whichever era the client speaks."""
    for p in ("low", "high"):
        who = await outcome(client.call_tool(f"{p}__test_elicitation", {"message": f"{p}: who are you?"}))
        out[f"{p}_elicitation"] = who
        out[f"{p}_sampling"] = await outcome(client.call_tool(f"{p}__test_sampling", {"prompt": f"{p}: 2+2"}))


def python_plugin_callbacks(out: dict) -> dict:
    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        out["asked"].append(params.message)
        return types.ElicitResult(action="accept", content={"username": "python", "email": "py@example.com"})

    async def sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        out["asked"].append(params.messages[0].content.text)
        return await sampling(context, params)

    return {"elicitation_callback": elicit, "sampling_callback": sample}


async def python_plugins_legacy(url: str) -> dict:
    """A legacy-era client (a session) in front of the Python SDK fixtures: their requests
    come on its streams; it subscribes to the low-level fixture's watched resource, hears of
    a change, and unsubscribes."""
    out: dict = {"asked": [], "updated": []}
    got_update = asyncio.Event()

    async def on_message(message) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            out["updated"].append(str(root.params.uri))
            got_update.set()

    callbacks = python_plugin_callbacks(out)
    async with Wire().client(url, message_handler=on_message, **callbacks) as client:
        out["protocol_version"] = client.protocol_version
        await python_plugins(client, out)
        watched = "test://watched-resource"
        try:
            await client.subscribe_resource(watched)
            out["subscribe"] = "ok"
        except MCPError as e:
            out["subscribe"] = f"error: {e.error.message}"
        out["touched"] = await outcome(client.call_tool("low__touch_resource", {"uri": watched}))
        if out["subscribe"] == "ok":
            await asyncio.wait_for(got_update.wait(), 20)
            await client.unsubscribe_resource(watched)
            out["touched_after"] = await outcome(client.call_tool("low__touch_resource", {"uri": watched}))
    return out


async def python_plugins_modern(url: str) -> dict:
    """A 2026-07-28 client in front of the Python SDK fixtures: their requests come to it as
    InputRequiredResults, which the SDK answers and retries; `Client.listen()` hears of a
    change of the low-level fixture's watched resource."""
    out: dict = {"asked": []}
    async with httpx2.AsyncClient(timeout=TIMEOUTS) as http:
        transport = streamable_http_client(url, http_client=http)
        callbacks = python_plugin_callbacks(out)
        async with Client(transport, mode="2026-07-28", cache=None, **callbacks) as client:
            out["protocol_version"] = client.protocol_version
            await python_plugins(client, out)
            watched = "test://watched-resource"
            async with client.listen(resource_subscriptions=[watched]) as sub:
                out["honored"] = sub.honored.model_dump(by_alias=True, exclude_none=True)
                out["touched"] = await outcome(client.call_tool("low__touch_resource", {"uri": watched}))
                try:
                    event = await asyncio.wait_for(sub.__anext__(), 10)
                    out["event"] = [type(event).__name__, getattr(event, "uri", None)]
                except TimeoutError:
                    out["event"] = "none within 10 s"
    return out


async def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    modes = {
        "fixture": fixture,
        "thirdparty": thirdparty,
        "polling": polling,
        "cluster": cluster,
        "modern": modern,
        "auto": auto,
        "modern_input": modern_input,
        "listen": listen,
        "legacy_modern_plugin": legacy_modern_plugin,
        "python_plugins_legacy": python_plugins_legacy,
        "python_plugins_modern": python_plugins_modern,
    }
    result = await modes[mode](url, *sys.argv[3:])
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
