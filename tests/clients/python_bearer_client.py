"""The official MCP Python SDK's client (mcp 2.x) against the gateway in external auth mode,
driven by tests/auth_external.rs, with a token from the authorization server the gateway
trusts (an OpenID provider the test runs).

Usage: python_bearer_client.py MODE URL ARGS...
  bearer TOKEN                       - the SDK's HTTP client sends `Authorization: Bearer TOKEN`
                                       (a token the test got from the provider)
  client_credentials ID SECRET ISSUER - the SDK's own OAuth client for the client credentials
                                       grant: it meets the 401, reads the gateway's protected
                                       resource metadata, finds the provider there (it must be
                                       ISSUER), and gets a token for the gateway from it
Both list the tools and call `fix__echo`. The client uses the legacy era (mode="legacy":
`initialize` at 2025-11-25). Prints one JSON object with what it saw; exits non-zero on any
failure.
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client, types
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

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


async def use(http: httpx2.AsyncClient, url: str) -> dict:
    out: dict = {}
    async with Client(streamable_http_client(url, http_client=http), mode="legacy", cache=None) as client:
        out["protocol_version"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        result = await client.call_tool("fix__echo", {"text": "hello from an external token"})
        out["echo"] = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    return out


async def bearer(url: str, token: str) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(timeout=TIMEOUTS, headers=headers) as http:
        return await use(http, url)


async def client_credentials(url: str, client_id: str, secret: str, issuer: str) -> dict:
    storage = MemoryStorage()
    auth = ClientCredentialsOAuthProvider(
        server_url=url,
        storage=storage,
        client_id=client_id,
        client_secret=secret,
        scope="mcp",
        issuer=issuer,
    )
    async with httpx2.AsyncClient(timeout=TIMEOUTS, auth=auth) as http:
        out = await use(http, url)
    out["token_scope"] = storage.tokens.scope if storage.tokens else None
    out["access_token"] = storage.tokens.access_token if storage.tokens else None
    return out


async def main() -> None:
    mode, url = sys.argv[1], sys.argv[2]
    modes = {"bearer": bearer, "client_credentials": client_credentials}
    print(json.dumps(await modes[mode](url, *sys.argv[3:])))


if __name__ == "__main__":
    asyncio.run(main())
