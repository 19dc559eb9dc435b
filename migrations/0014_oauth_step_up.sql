-- A dynamic registration's client secret (sealed with the credentials key, as people's values
-- are) and the token endpoint authentication the authorization server gave it, for servers
-- that register confidential clients (client_secret_basic, client_secret_post). This replaces
-- 0013's "only public clients are kept".
ALTER TABLE oauth_registrations ADD COLUMN client_secret TEXT;
ALTER TABLE oauth_registrations ADD COLUMN auth_method TEXT;
-- The scopes a request to connect asks for beyond the credential's own: those a server asked
-- for when it refused a person's token for want of them (insufficient_scope), joined with
-- those granted before.
ALTER TABLE credential_requests ADD COLUMN scopes TEXT;
