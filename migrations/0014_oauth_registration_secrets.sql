-- A dynamic registration's client secret (sealed with the credentials key, as people's values
-- are) and the token endpoint authentication the authorization server gave it, for servers
-- that register confidential clients (client_secret_basic, client_secret_post).
ALTER TABLE oauth_registrations ADD COLUMN client_secret TEXT;
ALTER TABLE oauth_registrations ADD COLUMN auth_method TEXT;
