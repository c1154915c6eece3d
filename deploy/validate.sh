#!/usr/bin/env bash
# Validates the deployment files, one line per check and a closing `deploy: N passed, M failed`:
#
# - deploy/kubernetes/**/*.yaml against the Kubernetes API schemas bundled in the PyPI package
#   kubernetes-validate (strict: unknown fields are errors; no network needed), for the oldest and
#   the newest Kubernetes version it bundles from 1.28 on. Kinds it has no schema for are checked
#   structurally instead: Kustomization (resources exist and are all listed), ServiceMonitor and
#   PodMonitor (Prometheus Operator CRDs: required fields, and that their selector and port match
#   the agent's pods/service). Cross-references are checked too (the ConfigMap and service account
#   the DaemonSet uses, the service selector, /healthz probes, --listen 0.0.0.0:9402, a NetworkPolicy
#   over the agent's pods admitting named sources to the metrics port only), and the image:
#   the DaemonSet's image is `<NAME>:<version>` as `cargo xtask image` tags it (NAME from
#   xtask/src/image.rs, the workspace version from Cargo.toml), kustomization.yaml maps that name
#   (`images:` with newName and newTag = the version), and a built archive in target/image/ carries
#   that tag.
# - the ConfigMap's quotas.toml and deploy/quotas.toml with `gpushare-agent check`;
# - deploy/systemd/gpushare-agent.service with `systemd-analyze verify` (any diagnostic fails it),
#   on a copy whose ExecStart points at the built binary (verify needs it to exist).
# - the Debian package's deploy/debian/quotas.toml with `gpushare-agent check` too, and its
#   maintainer scripts with `sh -n` (`cargo xtask deb --test` runs them).
#
# Needs the agent built (`cargo build`; or set GPUSHARE_AGENT). The validator is installed once into
# target/deploy-validate (a Python venv), quietly when it is already there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/target/deploy-validate"
VALIDATOR_VERSION="1.37.0"
AGENT="${GPUSHARE_AGENT:-$ROOT/target/debug/gpushare-agent}"

if ! "$VENV/bin/python" -c "import kubernetes_validate, yaml, sys; sys.exit(kubernetes_validate.__version__ != '$VALIDATOR_VERSION')" 2>/dev/null; then
  echo "deploy: installing kubernetes-validate $VALIDATOR_VERSION into target/deploy-validate" >&2
  rm -rf "$VENV"
  mkdir -p "$ROOT/target"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$VALIDATOR_VERSION"
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# 1. Kubernetes manifests (the Python part prints PASS/FAIL lines and extracts the ConfigMap's
#    quotas.toml into $TMP/configmap-quotas.toml).
set +e
"$VENV/bin/python" - "$ROOT" "$TMP" > "$TMP/k8s.out" <<'PY'
import glob, os, sys

import kubernetes_validate as kv
import yaml

root, tmp = sys.argv[1], sys.argv[2]
base = os.path.join(root, "deploy", "kubernetes")

# The image the build produces: `<NAME>:<workspace version>`.
import re, tomllib
with open(os.path.join(root, "Cargo.toml"), "rb") as f:
    VERSION = tomllib.load(f)["workspace"]["package"]["version"]
with open(os.path.join(root, "xtask", "src", "image.rs")) as f:
    IMAGE_NAME = re.search(r'pub const NAME: &str = "([^"]+)";', f.read()).group(1)
IMAGE_REF = f"{IMAGE_NAME}:{VERSION}"
versions = sorted({v for v in kv.utils.all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 28)},
                  key=lambda v: tuple(map(int, v.split("."))))
versions = [versions[0], versions[-1]] if len(versions) > 1 else versions
NO_SCHEMA = {"Kustomization", "ServiceMonitor", "PodMonitor"}

files = sorted(glob.glob(os.path.join(base, "**", "*.yaml"), recursive=True))
docs = {}  # path -> [resource]
problems = {}
for path in files:
    try:
        with open(path) as f:
            docs[path] = [d for d in yaml.safe_load_all(f) if d is not None]
    except yaml.YAMLError as e:
        docs[path] = []
        problems[path] = [f"not valid YAML: {e}"]

def all_of(kind):
    return [d for ds in docs.values() for d in ds if d.get("kind") == kind]

def get(d, *keys, default=None):
    for k in keys:
        if isinstance(d, dict) and k in d:
            d = d[k]
        elif isinstance(d, list) and isinstance(k, int) and k < len(d):
            d = d[k]
        else:
            return default
    return d

ds_list = all_of("DaemonSet")
pod_labels = get(ds_list[0], "spec", "template", "metadata", "labels", default={}) if ds_list else {}
pod_ports = [p.get("name") for c in get(ds_list[0], "spec", "template", "spec", "containers", default=[]) for p in c.get("ports", [])] if ds_list else []
services = all_of("Service")

def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

def check_monitor(d, errs):
    kind = d["kind"]
    if d.get("apiVersion") != "monitoring.coreos.com/v1":
        errs.append(f"apiVersion must be monitoring.coreos.com/v1, not {d.get('apiVersion')}")
    if not get(d, "metadata", "name"):
        errs.append("metadata.name is missing")
    sel = get(d, "spec", "selector", "matchLabels", default={})
    if not sel:
        errs.append("spec.selector.matchLabels is missing")
    key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    eps = get(d, "spec", key, default=[])
    if not isinstance(eps, list) or not eps:
        errs.append(f"spec.{key} must be a non-empty list")
        eps = []
    for i, ep in enumerate(eps):
        if not isinstance(ep, dict) or not ep.get("port"):
            errs.append(f"spec.{key}[{i}].port is missing")
        elif kind == "PodMonitor" and ep["port"] not in pod_ports:
            errs.append(f"port {ep['port']!r} is not a container port of the agent ({pod_ports})")
        elif kind == "ServiceMonitor" and not any(ep["port"] in [p.get("name") for p in get(s, "spec", "ports", default=[])] for s in services):
            errs.append(f"port {ep['port']!r} is not a port of any service")
        if isinstance(ep, dict) and ep.get("path", "/metrics") != "/metrics":
            errs.append(f"spec.{key}[{i}].path should be /metrics")
    if kind == "PodMonitor" and not matches(sel, pod_labels):
        errs.append(f"selector {sel} does not select the agent's pods {pod_labels}")
    if kind == "ServiceMonitor" and not any(matches(sel, get(s, "metadata", "labels", default={})) for s in services):
        errs.append(f"selector {sel} selects no service")
    ns = get(d, "spec", "namespaceSelector", "matchNames", default=[])
    if ns and "gpushare-system" not in ns:
        errs.append("spec.namespaceSelector.matchNames does not name gpushare-system")

def check_kustomization(path, d, errs):
    if d.get("apiVersion") != "kustomize.config.k8s.io/v1beta1":
        errs.append(f"apiVersion must be kustomize.config.k8s.io/v1beta1, not {d.get('apiVersion')}")
    here = os.path.dirname(path)
    listed = d.get("resources", []) or []
    if not listed:
        errs.append("resources is empty")
    for r in listed:
        if not os.path.exists(os.path.join(here, r)):
            errs.append(f"resource {r} does not exist")
    # Every manifest next to a kustomization is listed in it (the monitors may be commented out:
    # pick one), so nothing is silently left out of `kubectl apply -k`.
    text = open(path).read()
    for f in sorted(os.listdir(here)):
        if f.endswith(".yaml") and f != "kustomization.yaml" and f not in listed and f not in text:
            errs.append(f"{f} is neither listed nor mentioned")
    # The kustomization beside the DaemonSet names the image the build produces, in one place.
    if "daemonset.yaml" in listed:
        images = [i for i in (d.get("images") or []) if i.get("name") == IMAGE_NAME]
        if len(images) != 1:
            errs.append(f"images: needs exactly one entry named {IMAGE_NAME!r} (the build's name), has {d.get('images')}")
        else:
            i = images[0]
            if str(i.get("newTag")) != VERSION:
                errs.append(f"images: newTag is {i.get('newTag')!r}, the build tags {VERSION!r} (Cargo.toml)")
            if not i.get("newName"):
                errs.append("images: newName (the operator's repository) is missing")

def check_daemonset(d, errs):
    spec = get(d, "spec", "template", "spec", default={})
    if not spec.get("hostPID"):
        errs.append("hostPID must be true (the agent sees every pod's processes)")
    c = get(spec, "containers", 0, default={})
    if c.get("image") != IMAGE_REF:
        errs.append(f"image is {c.get('image')!r}, not {IMAGE_REF!r} (what `cargo xtask image` tags; kustomization.yaml maps it)")
    args = c.get("args", [])
    if "--listen" not in args or args[args.index("--listen") + 1] != "0.0.0.0:9402":
        errs.append("args must contain --listen 0.0.0.0:9402")
    for probe in ("livenessProbe", "readinessProbe"):
        if get(c, probe, "httpGet", "path") != "/healthz":
            errs.append(f"{probe} must GET /healthz")
    if not (get(c, "resources", "requests") and get(c, "resources", "limits")):
        errs.append("resources.requests and resources.limits are required")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    for m in ("/sys/fs/cgroup", "/sys/kernel/tracing", "/sys/kernel/btf", "/var/lib/gpushare", "/run/gpushare", "/etc/gpushare", "/var/log/pods"):
        if m not in mounts:
            errs.append(f"{m} is not mounted")
    cms = {get(x, "metadata", "name") for x in all_of("ConfigMap")}
    for v in spec.get("volumes", []):
        name = get(v, "configMap", "name")
        if name and name not in cms:
            errs.append(f"volume {v['name']} uses ConfigMap {name}, which no manifest defines")
    sa = spec.get("serviceAccountName")
    if sa and sa not in {get(x, "metadata", "name") for x in all_of("ServiceAccount")}:
        errs.append(f"service account {sa} is not defined")
    for s in services:
        if not matches(get(s, "spec", "selector", default={}), pod_labels):
            errs.append(f"service {get(s, 'metadata', 'name')} does not select the agent's pods")

def check_network_policy(d, errs):
    # The agent's pods admit the scrape only: every ingress rule names its sources and the
    # metrics port alone (issue 20: no other pod reads a node's workload series).
    if not matches(get(d, "spec", "podSelector", "matchLabels", default={}), pod_labels):
        errs.append(f"podSelector does not select the agent's pods {pod_labels}")
    if "Ingress" not in get(d, "spec", "policyTypes", default=[]):
        errs.append("policyTypes must include Ingress")
    rules = get(d, "spec", "ingress", default=[]) or []
    if not rules:
        errs.append("no ingress rule: the scrape would be refused too")
    for i, r in enumerate(rules):
        if not r.get("from"):
            errs.append(f"ingress[{i}] has no `from`: it admits every source")
        ports = [p.get("port") for p in r.get("ports", [])]
        if not ports or any(p not in ("metrics", 9402) for p in ports):
            errs.append(f"ingress[{i}] must admit the metrics port only, not {ports or 'every port'}")

for path in files:
    rel = os.path.relpath(path, root)
    errs = list(problems.get(path, []))
    how = set()
    for d in docs[path]:
        kind = d.get("kind", "?")
        if kind == "Kustomization":
            check_kustomization(path, d, errs)
            how.add("no bundled schema (kustomize config): structure and files checked")
            continue
        if kind in ("ServiceMonitor", "PodMonitor"):
            check_monitor(d, errs)
            how.add("Prometheus Operator CRD, no bundled schema: required fields and selectors checked")
            continue
        for v in versions:
            try:
                kv.validate(d, v, strict=True)
            except kv.SchemaNotFoundError:
                errs.append(f"no schema for {d.get('apiVersion')} {kind} in Kubernetes {v}")
            except kv.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                errs.append(f"{kind}/{get(d, 'metadata', 'name')} (Kubernetes {v}): {where}: {e.message}")
        how.add(f"schema, strict, Kubernetes {' and '.join(versions)}")
        if kind == "DaemonSet":
            check_daemonset(d, errs)
        if kind == "NetworkPolicy":
            check_network_policy(d, errs)
        if kind == "ConfigMap" and "quotas.toml" in (d.get("data") or {}):
            with open(os.path.join(tmp, "configmap-quotas.toml"), "w") as f:
                f.write(d["data"]["quotas.toml"])
    names = ", ".join(d.get("kind", "?") + (f"/{get(d, 'metadata', 'name')}" if get(d, "metadata", "name") else "") for d in docs[path])
    if errs:
        print(f"FAIL {rel}: " + "; ".join(errs))
    else:
        print(f"PASS {rel}: {names or 'empty'} ({'; '.join(sorted(how))})")
PY
py_rc=$?
set -e
while IFS= read -r line; do
  case "$line" in
    PASS\ *) pass "${line#PASS }" ;;
    FAIL\ *) fail "${line#FAIL }" ;;
    *) echo "$line" ;;
  esac
done < "$TMP/k8s.out"
if ((py_rc != 0)); then fail "deploy/kubernetes: the manifest checker crashed (exit $py_rc)"; fi

# 1b. A built image archive carries the tag the manifests name.
ref="$(sed -n 's/^pub const NAME: &str = "\(.*\)";/\1/p' "$ROOT/xtask/src/image.rs"):$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")"
archive="$ROOT/target/image/${ref%%:*}-${ref#*:}.tar"
if [[ -f "$archive" ]]; then
  if tags="$(tar -xOf "$archive" manifest.json 2>/dev/null)" && grep -qF "\"RepoTags\":[\"$ref\"]" <<<"$tags"; then
    pass "${archive#"$ROOT"/}: tagged $ref, as the DaemonSet names it"
  else
    fail "${archive#"$ROOT"/}: manifest.json does not tag it $ref: ${tags:-unreadable}"
  fi
else
  echo "note: no image archive built (cargo xtask image); the manifests were checked against $ref"
fi

# 2. Quota files.
if [[ ! -x "$AGENT" ]]; then
  fail "quota files: $AGENT is not built (run cargo build)"
else
  for q in "$ROOT/deploy/quotas.toml" "$ROOT/deploy/debian/quotas.toml" "$TMP/configmap-quotas.toml"; do
    name="${q#"$ROOT"/}"
    [[ "$q" == "$TMP"/* ]] && name="deploy/kubernetes/configmap.yaml (data.quotas.toml)"
    if [[ ! -f "$q" ]]; then fail "$name: missing"; continue; fi
    if out="$("$AGENT" check "$q" 2>&1)"; then
      if grep -q '^warning: ' <<<"$out"; then
        # A shipped example must not carry a configuration `check` warns about.
        fail "$name: gpushare-agent check warns:"$'\n'"$(grep '^warning: ' <<<"$out")"
        continue
      fi
      pass "$name: gpushare-agent check: valid, $(grep -cvE '^(ORIGIN |OK: |note: |\(no quota)' <<<"$out") quota entries"
    else
      fail "$name: gpushare-agent check:"$'\n'"$out"
    fi
  done
fi

# The Debian package's maintainer scripts (dpkg runs them with /bin/sh).
for script in postinst prerm postrm; do
  if out="$(sh -n "$ROOT/deploy/debian/$script" 2>&1)"; then
    pass "deploy/debian/$script: sh -n"
  else
    fail "deploy/debian/$script: sh -n:"$'\n'"$out"
  fi
done

# 3. The systemd unit.
unit="$ROOT/deploy/systemd/gpushare-agent.service"
if ! command -v systemd-analyze >/dev/null; then
  fail "deploy/systemd/gpushare-agent.service: systemd-analyze is not installed"
elif [[ ! -x "$AGENT" ]]; then
  fail "deploy/systemd/gpushare-agent.service: $AGENT is not built (verify needs ExecStart to exist)"
else
  mkdir -p "$TMP/unit"
  sed "s|^ExecStart=/usr/local/bin/gpushare-agent|ExecStart=$AGENT|" "$unit" > "$TMP/unit/gpushare-agent.service"
  if out="$(systemd-analyze verify --man=no "$TMP/unit/gpushare-agent.service" 2>&1)" && [[ -z "$out" ]]; then
    pass "deploy/systemd/gpushare-agent.service: systemd-analyze verify (ExecStart=$AGENT for the check)"
  else
    fail "deploy/systemd/gpushare-agent.service: systemd-analyze verify:"$'\n'"${out//$TMP\/unit\//}"
  fi
fi

echo "deploy: $passed passed, $failed failed"
((failed == 0))
