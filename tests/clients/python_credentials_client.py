"""The official MCP Python SDK's client (mcp 2.x) in front of a plugin that acts with the
caller's own credential, driven by tests/credentials.rs: the gateway asks for the credential
with a URL mode elicitation; the client's elicitation callback "opens" the link as a person's
browser would (the connect page's form, signed in as USER, with VALUE), then accepts, and the
call goes on with the person's own value.

Usage: python_credentials_client.py MODE URL TOKEN USER PASSWORD VALUE
  MODE is `legacy` (a session at 2025-11-25: `elicitation/create` on the call's stream, the
  call waiting) or `2026-07-28` (an InputRequiredResult, which the SDK resolves with the same
  callback and retries).
Calls `getenv` for TOKEN; prints one JSON object with what it saw; exits non-zero on failure.
"""

import asyncio
import json
import re
import sys

import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

# The SDK's own defaults for the HTTP client it would make (30 s, 300 s for a held stream).
TIMEOUTS = httpx2.Timeout(30.0, read=300.0)


async def main() -> None:
    mode, url, token, user, password, value = sys.argv[1:7]
    out: dict = {"asked": []}

    async def elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        link = getattr(params, "url", None)
        out["asked"].append({"mode": getattr(params, "mode", None), "url": link})
        if not link:
            return types.ElicitResult(action="decline")
        # The person's browser: the page, its cookie and its form's token, then the form.
        async with httpx2.AsyncClient(timeout=TIMEOUTS, follow_redirects=False) as browser:
            page = await browser.get(link)
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            done = await browser.post(
                link,
                data={"csrf": csrf, "username": user, "password": password, "value": value},
            )
            out["page"] = done.status_code
        return types.ElicitResult(action="accept")

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=TIMEOUTS, headers=headers) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, cache=None, elicitation_callback=elicit) as client:
            out["protocol_version"] = client.protocol_version
            result = await client.call_tool("getenv", {"name": "TOKEN"})
            out["is_error"] = bool(result.is_error)
            out["text"] = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
            # Connected: the next call asks nothing.
            again = await client.call_tool("getenv", {"name": "TOKEN"})
            out["again"] = "".join(c.text for c in again.content if isinstance(c, types.TextContent))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
