"""Cluster mode in the deployment files, checked offline (run by scripts/check-deploy with the
Python of .tools/deploy, which has PyYAML):

- deploy/compose.yaml runs three replicas sharing one Redis and one cluster secret (taken
  from the environment, never written in the file), each advertising its own service name
  and port, behind HAProxy; the single replica stays available (profile "single");
- deploy/config/haproxy.cfg balances those same replicas round-robin, keeps each session on
  the replica that answered for it (learned from `Mcp-Session-Id` in answers, shared by the
  two balancers of the compose file as peers at their fixed addresses; no cookies, no
  hashing), health-checks their /readyz on the admin port, and keeps the replicas' internal
  endpoint from clients;
- the Kubernetes manifests and the chart's renders (with cluster mode on and off) give the
  pods the Redis URL and secret from the Secret and their pod IP as advertise URL, and the
  Service no session affinity when cluster mode is on (ClientIP when off, for the chart);
- every one of those environments, given to `mcp-gateway check` with the config file it
  would read, turns cluster mode on (or leaves it off) as intended: the gateway's own
  parsing, not a guess at its variable names.

Usage: check-deploy-cluster.py GATEWAY_BINARY RENDERED_DIR
"""

import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
GATEWAY = sys.argv[1]
RENDERED = pathlib.Path(sys.argv[2])
# What the image sets (Dockerfile ENV), as scripts/check-deploy assumes for every config.
IMAGE_ENV = {"MCP_GATEWAY_LISTEN": "0.0.0.0:8080", "MCP_GATEWAY_ADMIN_LISTEN": "0.0.0.0:9090"}
# Stand-ins for the variables compose requires from the operator, and for a pod's IP.
OPERATOR_ENV = {
    "MCP_GATEWAY_ADMIN_TOKEN": "check-admin-token",
    "MCP_GATEWAY_CLUSTER_SECRET": "check-deploy-cluster-secret",
}
POD_IP = "10.1.2.3"
failures = []


def fail(what):
    failures.append(what)
    print(f"check-deploy: {what}", file=sys.stderr)


def check_config(label, config_text, env, expect_cluster):
    """Runs `mcp-gateway check` on `config_text` with exactly `env` (plus PATH) and compares
    the cluster line it prints with `expect_cluster` (None: cluster mode must be off)."""
    path = RENDERED / (re.sub(r"[^a-z0-9]+", "-", label) + ".toml")
    path.write_text(config_text)
    full = {"PATH": "/usr/bin:/bin", **IMAGE_ENV, **env}
    run = subprocess.run(
        [GATEWAY, "check", "--config", str(path)],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if run.returncode != 0:
        return fail(f"{label}: mcp-gateway check failed: {run.stderr.strip()}")
    line = next((l for l in run.stdout.splitlines() if l.startswith("cluster mode:")), None)
    if expect_cluster is None and line is not None:
        fail(f"{label}: cluster mode is on, expected off: {line}")
    elif expect_cluster is not None and line != f"cluster mode: {expect_cluster}":
        fail(f"{label}: expected `cluster mode: {expect_cluster}`, got {line!r}")
    else:
        print(f"check-deploy:   {label}: {line or 'one replica, state in memory'}")


# === compose ===


def interpolate(value):
    """Compose's ${VAR:-default} and ${VAR:?message}, with the operator's stand-ins."""

    def one(m):
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if op == ":-":
            return rest
        if name not in OPERATOR_ENV:
            raise SystemExit(f"check-deploy: compose requires ${{{name}}}, unknown here")
        return OPERATOR_ENV[name]

    return re.sub(r"\$\{([A-Z_]+)(:-|:\?)([^}]*)\}", one, str(value))


compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
services = compose["services"]
gateway_toml = (ROOT / "deploy/config/gateway.toml").read_text()
replicas = sorted(
    n for n, s in services.items() if "MCP_GATEWAY_REDIS_URL" in s.get("environment", {})
)
if replicas != ["gateway-1", "gateway-2", "gateway-3"]:
    fail(f"compose: the replicas in cluster mode are {replicas}, expected gateway-1..3")
for name in replicas:
    env = services[name]["environment"]
    if env.get("MCP_GATEWAY_ADVERTISE_URL") != f"http://{name}:8080":
        fail(f"compose: {name} advertises {env.get('MCP_GATEWAY_ADVERTISE_URL')!r}")
    secret = str(env.get("MCP_GATEWAY_CLUSTER_SECRET", ""))
    if not secret.startswith("${MCP_GATEWAY_CLUSTER_SECRET:?"):
        fail(f"compose: {name}'s cluster secret must come from the environment (${{…:?…}})")
    redis_host = re.match(r"rediss?://(?:[^@/]*@)?([^:/]+)", env["MCP_GATEWAY_REDIS_URL"])
    if not redis_host or redis_host.group(1) not in services:
        fail(f"compose: {name}'s Redis is not a service of the file")
for key in ("MCP_GATEWAY_REDIS_URL", "MCP_GATEWAY_CLUSTER_SECRET", "MCP_GATEWAY_DATABASE_URL"):
    if len({str(services[n]["environment"].get(key)) for n in replicas}) != 1:
        fail(f"compose: the replicas' {key} differ")
single = services.get("gateway", {})
if single.get("profiles") != ["single"] or "MCP_GATEWAY_REDIS_URL" in single.get(
    "environment", {}
):
    fail("compose: the single replica (service gateway, profile single, no Redis) is missing")
lb_config = "./config/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg"
balancers = {}
for name in ("lb", "lb-2"):
    lb = services.get(name, {})
    if not str(lb.get("image", "")).startswith("haproxy:") or not any(
        str(v).startswith(lb_config) for v in lb.get("volumes", [])
    ):
        fail(f"compose: the {name} service is not HAProxy with deploy/config/haproxy.cfg")
    address = ((lb.get("networks") or {}).get("default") or {}).get("ipv4_address")
    if lb.get("hostname") != name or not address:
        fail(f"compose: {name} needs hostname {name} and a fixed address (its peer name and address)")
    balancers[name] = address
for name in replicas + ["gateway"]:
    env = {k: interpolate(v) for k, v in services[name]["environment"].items()}
    expect = None
    if name != "gateway":
        expect = (
            "Redis redis://redis:6379, key prefix mcp-gateway:, "
            f"advertised as http://{name}:8080"
        )
    check_config(f"compose {name}", gateway_toml, env, expect)

# === haproxy.cfg ===

sections = {}
current = None
for raw in (ROOT / "deploy/config/haproxy.cfg").read_text().splitlines():
    line = raw.split("#", 1)[0].rstrip()
    if not line:
        continue
    if not line[0].isspace():
        current = line.strip()
        sections[current] = []
    elif current:
        sections[current].append(" ".join(line.split()))
def default_of(word):
    """The default of a quoted `"${NAME-default}"` (what HAProxy uses without NAME set)."""
    m = re.fullmatch(r'"\$\{[A-Z0-9_]+-([^}]*)\}"', word)
    return m.group(1) if m else word


backends = [k for k in sections if k.startswith("backend ")]
if len(backends) != 1:
    fail(f"haproxy.cfg: expected one backend, found {backends}")
else:
    lines = sections[backends[0]]
    servers = {default_of(l.split()[2]) for l in lines if l.startswith("server ")}
    if servers != {f"{n}:8080" for n in replicas}:
        fail(f"haproxy.cfg: its servers {sorted(servers)} are not the compose replicas")
    if "balance roundrobin" not in lines:
        fail("haproxy.cfg: the backend does not balance round-robin")
    blind = [l for l in lines if l.split()[0] in ("cookie", "hash-type", "hash-balance-factor")]
    if blind:
        fail(f"haproxy.cfg: affinity by cookie or hash: {blind}")
    for rule in (
        "stick match req.hdr(mcp-session-id)",
        "stick store-response res.hdr(mcp-session-id)",
    ):
        if rule not in lines:
            fail(f"haproxy.cfg: the backend lacks `{rule}`")
    table = [l for l in lines if l.startswith("stick-table ")]
    peers_name = table[0].split(" peers ", 1)[1].split()[0] if table and " peers " in table[0] else None
    if not peers_name:
        fail("haproxy.cfg: the stick table is not shared with peers")
    else:
        peers = {
            l.split()[1]: default_of(l.split()[2]).rsplit(":", 1)[0]
            for l in sections.get(f"peers {peers_name}", [])
            if l.startswith("peer ")
        }
        if peers != balancers:
            fail(f"haproxy.cfg: its peers {peers} are not compose's balancers {balancers}")
    if "http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost" not in lines or not any(
        l.startswith("default-server check port 9090") for l in lines
    ):
        fail("haproxy.cfg: the replicas are not health-checked on /readyz at the admin port")
forwarded = re.search(
    r'FORWARDED_PATH: &str = "([^"]+)"', (ROOT / "src/cluster/forward.rs").read_text()
)
denied = [
    l.split("path_beg ", 1)[1].split()[0]
    for s in sections
    if s.startswith("frontend ")
    for l in sections[s]
    if l.startswith("http-request deny") and "path_beg " in l
]
if not forwarded or not any(forwarded.group(1).startswith(p) for p in denied):
    fail("haproxy.cfg: the frontend serves the replicas' internal endpoint to clients")

# === Kubernetes ===


def pod_env(container, secret):
    """A container's environment as the kubelet makes it: the Secret's keys (envFrom), then
    `env` in order, $(VAR) expanded from the entries before it, the pod IP from the downward
    API."""
    env = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            env.update(secret)
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = re.sub(
                r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: env.get(m.group(1), m.group(0)),
                entry["value"],
            )
        elif entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[entry["name"]] = POD_IP
        else:
            fail(f"kubernetes: env {entry['name']}: a source this check does not know")
    return env


def objects(text):
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


def kind(objs, k):
    return [d for (dk, _), d in objs.items() if dk == k]


def check_rendered(label, objs, secret, expect_cluster, affinity):
    """One set of manifests: the Service's affinity, then the gateway's config and env."""
    mcp = [s for s in kind(objs, "Service") if any(p["name"] == "mcp" for p in s["spec"]["ports"])]
    got = [s["spec"].get("sessionAffinity", "None") for s in mcp]
    if got != [affinity]:
        fail(f"{label}: the Service's sessionAffinity is {got}, expected {affinity}")
    config = kind(objs, "ConfigMap")[0]["data"]["gateway.toml"]
    (deployment,) = kind(objs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    check_config(label, config, pod_env(container, secret), expect_cluster)


k8s = ROOT / "deploy/kubernetes"
manifests = {}
for f in sorted(k8s.glob("*.yaml")):
    if f.name not in ("kustomization.yaml", "secret.example.yaml"):
        manifests.update(objects(f.read_text()))
example_secret = yaml.safe_load((k8s / "secret.example.yaml").read_text())["stringData"]
check_rendered(
    "kubernetes",
    manifests,
    example_secret,
    "Redis redis://:***@redis.example.svc:6379, key prefix mcp-gateway:, "
    f"advertised as http://{POD_IP}:8080",
    "None",
)
# Without the two cluster keys, the Secret the comments describe: one replica per session.
without = {
    k: v
    for k, v in example_secret.items()
    if k not in ("MCP_GATEWAY_REDIS_URL", "MCP_GATEWAY_CLUSTER_SECRET")
}
pod = manifests[("Deployment", "mcp-gateway")]["spec"]["template"]["spec"]
check_config(
    "kubernetes without Redis",
    manifests[("ConfigMap", "mcp-gateway")]["data"]["gateway.toml"],
    pod_env(pod["containers"][0], without),
    None,
)

# === the chart's renders (made by scripts/check-deploy) ===

cluster = objects((RENDERED / "cluster.yaml").read_text())
secrets = kind(cluster, "Secret")
check_rendered(
    "chart cluster.enabled, secret.create",
    cluster,
    secrets[0]["stringData"] if secrets else {},
    "Redis redis://:***@redis:6379/0, key prefix gw-check:, "
    f"advertised as http://{POD_IP}:8080",
    "None",
)
existing = objects((RENDERED / "cluster-existing.yaml").read_text())
if kind(existing, "Secret"):
    fail("chart cluster.enabled, existingSecret: the chart made a Secret")
check_rendered(
    "chart cluster.enabled, existingSecret",
    existing,
    {
        "MCP_GATEWAY_REDIS_URL": "redis://redis:6379",
        "MCP_GATEWAY_CLUSTER_SECRET": OPERATOR_ENV["MCP_GATEWAY_CLUSTER_SECRET"],
    },
    "Redis redis://redis:6379, key prefix mcp-gateway:, "
    f"advertised as http://{POD_IP}:8080",
    "None",
)
default = objects((RENDERED / "default.yaml").read_text())
check_rendered("chart default", default, {}, None, "ClientIP")
pod = kind(default, "Deployment")[0]["spec"]["template"]["spec"]
env_names = {e["name"] for e in pod["containers"][0]["env"]}
if env_names & {"POD_IP", "MCP_GATEWAY_ADVERTISE_URL", "MCP_GATEWAY_REDIS_KEY_PREFIX"}:
    fail("chart default: cluster settings without cluster.enabled")

if failures:
    sys.exit(1)
