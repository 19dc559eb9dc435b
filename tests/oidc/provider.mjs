// An OpenID provider for the tests: `oidc-provider` (the certified OpenID Connect provider
// library for Node) on 127.0.0.1, configured from a JSON argument, so that tests run the
// gateway against a real authorization server of their own.
//
// Usage: node provider.mjs '<settings JSON>'; prints `issuer <url>` once it listens, then logs
// nothing unless OIDC_DEBUG is set. Settings (all optional):
//   port             the port to listen on (0, the default: any free one)
//   admin_token      the bearer token of the /__test routes (without it they are closed)
//   clients          client metadata as oidc-provider takes it (client_id, client_secret,
//                    grant_types, redirect_uris, token_endpoint_auth_method, scope, ...), with
//                    two keys of this harness: access_token_format ("jwt", the default, or
//                    "opaque": what access tokens this client gets for a resource) and groups
//                    (the groups claim of its client_credentials tokens)
//   accounts         [{sub, password, email, name, groups}]: who can sign in
//   groups_claim     the claim (and scope) that carries groups: "groups" by default
//   resource_scope   the scopes a resource server accepts: "mcp" by default; any absolute
//                    URL is a resource this provider mints tokens for (RFC 8707)
//   access_token_ttl seconds: 300 by default
//   alg              the signing algorithm of the keys it makes: RS256 (default) or ES256
//   refresh_tokens   true: a code grant gives a refresh token to every client allowed the
//                    refresh_token grant (without it, only with offline_access and consent)
//   rotate_refresh   true: every refresh gives a new refresh token and retires the old one
//   exchange_audiences  the audiences (or resources) the RFC 8693 token exchange grant
//                    (urn:ietf:params:oauth:grant-type:token-exchange, for clients that list
//                    it) mints tokens for: an access token of this provider (a JWT, or an
//                    opaque one it issued at a person's sign-in) is exchanged
//                    for a JWT with that `aud`, the same `sub`, the scopes asked and `act`
//                    naming the client; any other audience is refused with invalid_target
//
// Accounts sign in at /interaction/<uid> with a form (fields `login` and `password`, button
// `#submit`); a wrong password shows the form again with "Invalid login or password".
// Consent is given without a page (a first-party provider). ID tokens carry the claims of the
// scopes granted (email, profile, groups), not only userinfo.
//
// Test routes (need `Authorization: Bearer <admin_token>`):
//   POST /__test/rotate[?keep=0]  a new signing key, first in the JWKS; the old ones stay
//                                 published unless keep=0. Answers {kid}.
//   GET  /__test/signing-key      the current private signing key (a JWK, with `pem`: PKCS#8,
//                                 `der`: base64 of PKCS#1 for RSA or PKCS#8 for EC, as
//                                 jsonwebtoken takes them, and `public_pem`: SPKI), for tests
//                                 that forge tokens the provider could have signed
//   GET  /__test/counts           requests served, by path ({"/jwks": 3, ...})
// Rotation builds a new Provider on the same issuer; its state (the in-memory adapter) is
// kept, so sessions, grants and tokens survive it.

import {
  createPrivateKey, createPublicKey, generateKeyPairSync, randomBytes, sign, verify,
} from 'node:crypto';
import { createServer } from 'node:http';

// stdout carries the issuer line only; oidc-provider's notices go to stderr with the rest.
console.log = console.error;
console.info = console.error;
console.warn = console.error;

const here = new URL('.', import.meta.url);
const modules = process.env.OIDC_PROVIDER_MODULES
  ? new URL(`file://${process.env.OIDC_PROVIDER_MODULES.replace(/\/?$/, '/')}`)
  : new URL('../../.tools/oidc/node_modules/', here);
const { default: Provider, errors } = await import(new URL('oidc-provider/lib/index.js', modules));

const settings = JSON.parse(process.argv[2] ?? process.env.OIDC_SETTINGS ?? '{}');
const groupsClaim = settings.groups_claim ?? 'groups';
const resourceScope = settings.resource_scope ?? 'mcp';
const accessTtl = settings.access_token_ttl ?? 300;
const alg = settings.alg ?? 'RS256';
const accounts = new Map((settings.accounts ?? []).map((a) => [a.sub, a]));
const clientFormats = new Map();
const clientGroups = new Map();
const clients = (settings.clients ?? []).map((c) => {
  const { access_token_format: format, groups, ...meta } = c;
  clientFormats.set(meta.client_id, format ?? 'jwt');
  if (groups) clientGroups.set(meta.client_id, groups);
  if (!meta.grant_types?.includes('authorization_code') && !meta.grant_types?.includes('implicit')) {
    meta.response_types ??= [];
    meta.redirect_uris ??= [];
  }
  return meta;
});
const cookieKeys = [randomBytes(32).toString('base64url')];
const counts = {};
const debug = process.env.OIDC_DEBUG ? (...a) => console.error(...a) : () => {};

let keys = [newKey()];
let provider;
let handler;
let issuer;

function newKey() {
  const kid = randomBytes(9).toString('base64url');
  const pair = alg === 'ES256'
    ? generateKeyPairSync('ec', { namedCurve: 'P-256' })
    : generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...pair.privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig' };
}

async function findAccount(_ctx, id) {
  const a = accounts.get(id);
  if (!a) return undefined;
  return {
    accountId: id,
    async claims() {
      return {
        sub: id,
        email: a.email,
        email_verified: a.email !== undefined ? true : undefined,
        name: a.name,
        [groupsClaim]: a.groups ?? [],
      };
    },
  };
}

function build() {
  const p = new Provider(issuer, {
    clients,
    jwks: { keys },
    cookies: { keys: cookieKeys },
    findAccount,
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name'],
      [groupsClaim]: [groupsClaim],
    },
    scopes: ['openid', 'offline_access', ...resourceScope.split(' ')],
    conformIdTokenClaims: false,
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    ttl: {
      AccessToken: accessTtl,
      ClientCredentials: accessTtl,
      AuthorizationCode: 60,
      IdToken: 3600,
      Interaction: 600,
      Session: 3600,
      Grant: 3600,
      RefreshToken: 3600,
    },
    ...(settings.refresh_tokens
      ? { issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token') }
      : {}),
    ...(settings.rotate_refresh ? { rotateRefreshToken: () => true } : {}),
    async extraTokenClaims(_ctx, token) {
      if (token.accountId) {
        const a = accounts.get(token.accountId);
        return a ? { [groupsClaim]: a.groups ?? [] } : undefined;
      }
      const groups = clientGroups.get(token.clientId);
      return groups ? { [groupsClaim]: groups } : undefined;
    },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, _client, oneOf) => oneOf,
        useGrantedResource: () => true,
        getResourceServerInfo(_ctx, resource, client) {
          let url;
          try {
            url = new URL(resource);
          } catch {
            throw new errors.InvalidTarget();
          }
          if (url.hash) throw new errors.InvalidTarget();
          const format = clientFormats.get(client.clientId) ?? 'jwt';
          return {
            scope: resourceScope,
            audience: resource,
            accessTokenTTL: accessTtl,
            accessTokenFormat: format,
            ...(format === 'jwt' ? { jwt: { sign: { alg, kid: keys[0].kid } } } : {}),
          };
        },
      },
    },
  });
  p.on('server_error', (_ctx, err) => console.error('oidc-provider server_error', err));
  p.registerGrantType(TOKEN_EXCHANGE, tokenExchange, [
    'subject_token', 'subject_token_type', 'audience', 'resource', 'scope',
    'requested_token_type', 'actor_token', 'actor_token_type',
  ]);
  return p;
}

const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN_TYPE = 'urn:ietf:params:oauth:token-type:access_token';

function b64url(buf) {
  return Buffer.from(buf).toString('base64url');
}

// A JWT signed with the current key (RS256 or ES256, as the provider's tokens are).
function signJwt(payload) {
  const header = { alg, kid: keys[0].kid, typ: 'at+jwt' };
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(payload))}`;
  const key = createPrivateKey({ key: keys[0], format: 'jwk' });
  const signature = alg === 'ES256'
    ? sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' })
    : sign('sha256', Buffer.from(input), key);
  return `${input}.${b64url(signature)}`;
}

// The claims of a JWT this provider signed and that has not expired, else undefined.
function verifyJwt(token) {
  const parts = String(token).split('.');
  if (parts.length !== 3) return undefined;
  try {
    const header = JSON.parse(Buffer.from(parts[0], 'base64url'));
    const jwk = keys.find((k) => k.kid === header.kid);
    if (!jwk) return undefined;
    const key = createPublicKey({ key: jwk, format: 'jwk' });
    const data = Buffer.from(`${parts[0]}.${parts[1]}`);
    const signature = Buffer.from(parts[2], 'base64url');
    const ok = jwk.kty === 'EC'
      ? verify('sha256', data, { key, dsaEncoding: 'ieee-p1363' }, signature)
      : verify('sha256', data, key, signature);
    if (!ok) return undefined;
    const claims = JSON.parse(Buffer.from(parts[1], 'base64url'));
    if (claims.iss !== issuer || !(claims.exp > Date.now() / 1000)) return undefined;
    return claims;
  } catch {
    return undefined;
  }
}

// RFC 8693, for the audiences the settings name.
async function tokenExchange(ctx) {
  const params = ctx.oidc.params;
  if (params.subject_token_type !== ACCESS_TOKEN_TYPE) {
    throw new errors.InvalidRequest('unsupported subject_token_type');
  }
  // A JWT access token of this provider, or an opaque one it issued (a person's sign-in).
  let claims = verifyJwt(params.subject_token);
  if (!claims) {
    const opaque = await provider.AccessToken.find(String(params.subject_token));
    if (opaque?.accountId && !opaque.isExpired) claims = { sub: opaque.accountId };
  }
  if (!claims?.sub) throw new errors.InvalidGrant('the subject token is not valid');
  const target = params.audience ?? params.resource;
  if (!target || !(settings.exchange_audiences ?? []).includes(target)) {
    throw new errors.InvalidTarget('this audience is not exchanged for');
  }
  const now = Math.floor(Date.now() / 1000);
  const scope = params.scope ?? '';
  ctx.body = {
    access_token: signJwt({
      iss: issuer, sub: claims.sub, aud: target, iat: now, exp: now + accessTtl,
      scope, client_id: ctx.oidc.client.clientId, act: { sub: ctx.oidc.client.clientId },
      jti: randomBytes(12).toString('base64url'),
    }),
    issued_token_type: ACCESS_TOKEN_TYPE,
    token_type: 'Bearer',
    expires_in: accessTtl,
    ...(scope ? { scope } : {}),
  };
}

function install(p) {
  provider = p;
  handler = p.callback();
}

function page(title, body) {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${title}</title></head><body>${body}</body></html>`;
}

function escape(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginForm(uid, error) {
  return page('Sign in', `<h1>Sign in to the test provider</h1>
${error ? `<p id="error">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Login <input name="login" id="login" autofocus></label>
<label>Password <input name="password" id="password" type="password"></label>
<button type="submit" id="submit">Sign in</button>
</form>`);
}

async function readForm(req) {
  const chunks = [];
  let size = 0;
  for await (const c of req) {
    size += c.length;
    if (size > 64 * 1024) throw new Error('form too large');
    chunks.push(c);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString());
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(body);
}

// The sign-in form, and consent given without asking.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new errors.SessionNotFound('interaction mismatch');
  const { prompt, params, session, grantId } = details;
  if (prompt.name === 'login') {
    if (req.method === 'POST' && action === 'login') {
      const form = await readForm(req);
      const account = accounts.get(form.get('login') ?? '');
      if (!account || account.password !== form.get('password')) {
        send(res, 200, 'text/html; charset=utf-8', loginForm(uid, 'Invalid login or password'));
        return;
      }
      await provider.interactionFinished(req, res, { login: { accountId: account.sub } }, {
        mergeWithLastSubmission: false,
      });
      return;
    }
    send(res, 200, 'text/html; charset=utf-8', loginForm(uid));
    return;
  }
  if (prompt.name === 'consent') {
    const grant = grantId
      ? await provider.Grant.find(grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const d = prompt.details;
    if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
    if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(d.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    await provider.interactionFinished(req, res, { consent: { grantId: await grant.save() } }, {
      mergeWithLastSubmission: true,
    });
    return;
  }
  send(res, 501, 'text/plain', `prompt ${prompt.name} is not handled`);
}

function admin(req, res, path) {
  if (!settings.admin_token || req.headers.authorization !== `Bearer ${settings.admin_token}`) {
    send(res, 401, 'text/plain', 'admin token needed');
    return;
  }
  const url = new URL(req.url, issuer);
  if (req.method === 'POST' && path === '/__test/rotate') {
    const key = newKey();
    keys = url.searchParams.get('keep') === '0' ? [key] : [key, ...keys];
    install(build());
    send(res, 200, 'application/json', JSON.stringify({ kid: key.kid }));
  } else if (req.method === 'GET' && path === '/__test/signing-key') {
    const key = createPrivateKey({ key: keys[0], format: 'jwk' });
    send(res, 200, 'application/json', JSON.stringify({
      ...keys[0],
      pem: key.export({ type: 'pkcs8', format: 'pem' }),
      der: key.export({ type: keys[0].kty === 'RSA' ? 'pkcs1' : 'pkcs8', format: 'der' })
        .toString('base64'),
      public_pem: createPublicKey(key).export({ type: 'spki', format: 'pem' }),
    }));
  } else if (req.method === 'GET' && path === '/__test/counts') {
    send(res, 200, 'application/json', JSON.stringify(counts));
  } else {
    send(res, 404, 'text/plain', 'no such test route');
  }
}

const server = createServer(async (req, res) => {
  const path = new URL(req.url, 'http://x').pathname;
  counts[path] = (counts[path] ?? 0) + 1;
  debug(req.method, req.url);
  try {
    if (path.startsWith('/__test/')) {
      admin(req, res, path);
      return;
    }
    const m = /^\/interaction\/([^/]+)(?:\/(login))?$/.exec(path);
    if (m) {
      await interaction(req, res, m[1], m[2]);
      return;
    }
    handler(req, res);
  } catch (err) {
    debug(err);
    if (!res.headersSent) {
      send(res, err.statusCode ?? 500, 'text/html; charset=utf-8',
        page('Error', `<h1>Error</h1><p id="error">${escape(err.error_description ?? err.message)}</p>`));
    }
  }
});

server.on('clientError', (err, socket) => {
  console.error('oidc test provider: bad request:', err.code ?? err.message);
  socket.destroy();
});

server.listen(settings.port ?? 0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  install(build());
  process.stdout.write(`issuer ${issuer}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => process.exit(0));
}
