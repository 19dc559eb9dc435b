"""The official MCP Python SDK's (mcp 2.x) OAuth client (mcp.client.auth) against the gateway in
builtin mode with sign-in at an upstream OpenID provider, driven by tests/auth_upstream.rs.

Usage: python_upstream_client.py URL TOOL
The SDK meets the 401, discovers the resource and authorization server metadata, registers
itself (dynamic client registration), and hands the authorization URL (PKCE) to its redirect
handler, which prints it as a line `authorize <url>` for the test to open in a real browser:
the person signs in at the provider and approves at the gateway's consent page, and the browser
lands on this script's callback server (127.0.0.1, a port of its own, the redirect URI it
registered). The SDK exchanges the code, lists the tools and calls TOOL (an echo). The client
uses the legacy era (mode="legacy"). Prints, last, one line `result <JSON>` with what it saw;
exits non-zero on any failure.
"""

import asyncio
import base64
import json
import sys
from urllib.parse import parse_qs, urlparse

import httpx2
from mcp import Client, types
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

# The SDK's own defaults for the HTTP client it would make (30 s, 300 s for a held stream).
TIMEOUTS = httpx2.Timeout(30.0, read=300.0)


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def main(url: str, tool: str) -> dict:
    out: dict = {}
    landed: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_callback(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        target = line.split(" ")[1] if " " in line else "/"
        q = parse_qs(urlparse(target).query)
        body = b"signed in; you can close this window"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()
        if urlparse(target).path == "/callback" and not landed.done():
            if "code" not in q:
                landed.set_exception(RuntimeError(f"the callback has no code: {target}"))
            else:
                landed.set_result(
                    AuthorizationCodeResult(
                        code=q["code"][0], state=q.get("state", [None])[0], iss=q.get("iss", [None])[0]
                    )
                )

    server = await asyncio.start_server(on_callback, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    redirect = f"http://127.0.0.1:{port}/callback"

    async def browser(authorization_url: str) -> None:
        out["authorization_url"] = authorization_url
        print(f"authorize {authorization_url}", flush=True)

    async def callback() -> AuthorizationCodeResult:
        return await asyncio.wait_for(landed, 120)

    storage = MemoryStorage()
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="python-sdk-upstream",
            redirect_uris=[redirect],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser,
        callback_handler=callback,
    )
    async with (
        server,
        httpx2.AsyncClient(auth=auth, timeout=TIMEOUTS) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
    ):
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        result = await client.call_tool(tool, {"text": "hello from upstream"})
        out["echo"] = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    out["registered_client"] = storage.client is not None and bool(storage.client.client_id)
    token = storage.tokens.access_token if storage.tokens else ""
    out["token_claims"] = claims(token) if token.count(".") == 2 else None
    out["token_fields"] = sorted(storage.tokens.model_dump(exclude_none=True).keys()) if storage.tokens else []
    return out


if __name__ == "__main__":
    print(f"result {json.dumps(asyncio.run(main(*sys.argv[1:3])))}", flush=True)
