-- The gateway's registrations (RFC 7591) at the authorization servers of remote MCP servers,
-- one per credential and issuer: the first replica to register wins, every other one uses its
-- client. Only public clients (token_endpoint_auth_method none) are kept: no secret here.
CREATE TABLE IF NOT EXISTS oauth_registrations (
    credential TEXT NOT NULL,
    issuer TEXT NOT NULL,
    client_id TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (credential, issuer)
);
