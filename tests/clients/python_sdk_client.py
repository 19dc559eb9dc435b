"""A real MCP client, the official Python SDK, driven against the gateway by tests/python_sdk.rs.

Usage: python_sdk_client.py MODE URL
  fixture     - the gateway fronts tests/fixture: tools, resources, prompts, sampling,
                progress, cancellation, then DELETE on close
  thirdparty  - the gateway fronts @modelcontextprotocol/server-everything (npm) and
                mcp-server-time (PyPI), prefixed `everything__` and `time__`
  polling     - the gateway fronts tests/fixture and closes SSE connections mid-call
                (polling mode): calls must still complete
Prints one JSON object with what it saw; exits non-zero on any failure.
"""

import asyncio
import json
import sys
from datetime import timedelta

from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from pydantic import AnyUrl


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
    async with streamablehttp_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write, sampling_callback=sampling) as session:
            init = await session.initialize()
            out["session_id"] = get_session_id()
            out["protocol_version"] = init.protocolVersion
            out["server_name"] = init.serverInfo.name
            tools = await session.list_tools()
            out["tools"] = sorted(t.name for t in tools.tools)
            out["echo"] = text_of(await session.call_tool("echo", {"text": "hello from python"}))
            res = await session.read_resource(AnyUrl("test://static-text"))
            out["resource"] = res.contents[0].text
            prompt = await session.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
            out["prompt"] = prompt.messages[0].content.text
            out["sampling"] = text_of(await session.call_tool("test_sampling", {"prompt": "what is 2+2"}))

            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            done = await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
            out["progress_result"] = text_of(done)
            out["progress"] = progress

            # Cancellation: start a slow call, wait for its first progress (it reached the
            # plugin), then send notifications/cancelled for its request id.
            started = asyncio.Event()

            async def on_slow_progress(p: float, total: float | None, message: str | None) -> None:
                started.set()

            slow_id = session._request_id
            slow = asyncio.create_task(
                session.call_tool(
                    "slow",
                    {"ms": 60000},
                    read_timeout_seconds=timedelta(seconds=3),
                    progress_callback=on_slow_progress,
                )
            )
            await asyncio.wait_for(started.wait(), 20)
            await session.send_notification(
                types.ClientNotification(
                    types.CancelledNotification(
                        params=types.CancelledNotificationParams(requestId=slow_id, reason="test cancels")
                    )
                )
            )
            try:
                await slow
                out["cancelled"] = "completed (unexpected)"
            except McpError as e:
                out["cancelled"] = f"no response: {e.error.message}"
            out["after_cancel"] = text_of(await session.call_tool("echo", {"text": "still alive"}))
    return out


async def thirdparty(url: str) -> dict:
    out: dict = {}
    async with streamablehttp_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write) as session:
            await session.initialize()
            out["session_id"] = get_session_id()
            tools = await session.list_tools()
            names = [t.name for t in tools.tools]
            out["tools"] = sorted(names)
            out["echo"] = text_of(await session.call_tool("everything__echo", {"message": "through the gateway"}))
            now = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
            out["time"] = json.loads(text_of(now))
            prompts = await session.list_prompts()
            out["prompts"] = sorted(p.name for p in prompts.prompts)
    return out


async def polling(url: str) -> dict:
    out: dict = {}
    async with streamablehttp_client(url) as (read, write, get_session_id):
        async with ClientSession(read, write) as session:
            await session.initialize()
            out["slow"] = text_of(await session.call_tool("slow", {"ms": 1500}))
            progress: list[float] = []

            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                progress.append(p)

            out["burst"] = text_of(await session.call_tool("burst", {"count": 300, "pause_us": 3000}))
            out["progress"] = text_of(
                await session.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
            )
            out["progress_values"] = progress
    return out


async def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    result = await {"fixture": fixture, "thirdparty": thirdparty, "polling": polling}[mode](url)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
