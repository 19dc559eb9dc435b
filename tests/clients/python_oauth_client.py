"""The official MCP Python SDK's (mcp 2.x) OAuth client (mcp.client.auth) against the gateway in
builtin mode, driven by tests/auth.rs.

Usage: python_oauth_client.py URL USER PASSWORD
The SDK meets the 401, discovers the resource and authorization server metadata, registers
itself (dynamic client registration), and sends the "browser" to /authorize with PKCE. The
browser here is an HTTP client that fills in the sign-in and consent forms as a person would;
the code it lands with goes back to the SDK, which exchanges it and calls a tool. The client
uses the legacy era (mode="legacy": `initialize` at 2025-11-25), the one the gateway serves.
Prints one JSON object with what it saw; exits non-zero on any failure.
"""

import asyncio
import json
import re
import sys
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp import Client, types
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

REDIRECT = "http://127.0.0.1:9/callback"

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


def field(html: str, name: str) -> str:
    m = re.search(rf'name="{name}" value="([^"]*)"', html)
    if not m:
        raise RuntimeError(f"no {name} field in page: {html[:500]}")
    return m.group(1)


async def main(url: str, user: str, password: str) -> dict:
    out: dict = {"pages": []}
    landed: asyncio.Future = asyncio.get_running_loop().create_future()

    async def browser(authorization_url: str) -> None:
        out["authorization_url"] = authorization_url
        async with httpx2.AsyncClient(follow_redirects=False) as b:
            page = await b.get(authorization_url)
            page.raise_for_status()
            out["pages"].append("sign-in")
            form = {"request": field(page.text, "request"), "csrf": field(page.text, "csrf")}
            base = f"{urlparse(authorization_url).scheme}://{urlparse(authorization_url).netloc}"
            r = await b.post(urljoin(base, "/authorize/login"), data={**form, "username": user, "password": password})
            if r.status_code == 200:
                out["pages"].append("consent")
                r = await b.post(urljoin(base, "/authorize/consent"), data={**form, "decision": "approve"})
            if r.status_code != 303:
                raise RuntimeError(f"expected a redirect to the client, got {r.status_code}: {r.text[:300]}")
            q = parse_qs(urlparse(r.headers["location"]).query)
            landed.set_result(
                AuthorizationCodeResult(
                    code=q["code"][0], state=q.get("state", [None])[0], iss=q.get("iss", [None])[0]
                )
            )

    async def callback() -> AuthorizationCodeResult:
        return await landed

    storage = MemoryStorage()
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="python-sdk-oauth",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser,
        callback_handler=callback,
    )
    async with (
        httpx2.AsyncClient(auth=auth, timeout=TIMEOUTS) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client,
    ):
        out["protocol_version"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = [t.name for t in tools.tools]
        result = await client.call_tool("fix__echo", {"text": "hello with a token"})
        out["echo"] = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    out["registered_client"] = storage.client is not None and bool(storage.client.client_id)
    out["token_scope"] = storage.tokens.scope if storage.tokens else None
    out["has_refresh_token"] = bool(storage.tokens and storage.tokens.refresh_token)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
