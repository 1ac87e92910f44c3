"""The Kubernetes manifests agree with each other and with legate's config: the sidecar is the
same in the example and in the kustomize component, key files come from the mounted Secret, the
grace period covers shutdown_grace, probes and scrapes hit the admin port, the agent is pointed
at the data plane, every container is locked down, legate's buffers fit its memory limit, Claude
prices cover dated snapshots, and the example never applies a placeholder Secret.
kubernetes-validate checks the schemas in .ci/deploy-checks; here the component's patch is
merged into a plain Deployment and validated."""

import copy
import ipaddress
import posixpath
import re
import tomllib

import kubernetes_validate
import pytest
import yaml

import deploytool
from deploytool import K8S

GRACE_MARGIN_S = 5
SECRET_NAME = "legate-provider-keys"
# README's defaults for the [server] keys that bound what legate holds in memory.
DEFAULT_MAX_BUFFERED_BYTES = 268435456
DEFAULT_MAX_BODY_BYTES = 33554432
# Room for legate's own memory beyond the two buffers bounded by max_buffered_bytes.
OWN_MEMORY_BYTES = 32 * 2**20


def example_deployment():
    return deploytool.load_yaml(K8S / "deployment.yaml")


def component_patch():
    return deploytool.load_yaml(K8S / "sidecar" / "sidecar-patch.yaml")


def pod_specs():
    """(name, pod template) for the example and for the component's patch."""
    return [
        ("deployment.yaml", example_deployment()["spec"]["template"]),
        ("sidecar/sidecar-patch.yaml", component_patch()["spec"]["template"]),
    ]


def legate_container(pod_spec):
    sidecars = [c for c in pod_spec.get("initContainers", []) if c["name"] == "legate"]
    assert len(sidecars) == 1, "exactly one init container named legate"
    return sidecars[0]


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def host_of(addr):
    return addr.rsplit(":", 1)[0].strip("[]")


def strategic_merge(base, patch):
    """Strategic merge as kustomize applies it to these files: maps merge key by key, lists of
    named objects (containers, volumes, mounts, env) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    named = all(isinstance(i, dict) and "name" in i for i in (base or []) + (patch or []))
    if isinstance(base, list) and isinstance(patch, list) and named:
        out = [copy.deepcopy(i) for i in base]
        index = {i["name"]: n for n, i in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = strategic_merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


PLAIN_DEPLOYMENT = yaml.safe_load(
    """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: existing-agent
  labels: {legate-sidecar: "true"}
spec:
  selector:
    matchLabels: {app: existing-agent}
  template:
    metadata:
      labels: {app: existing-agent}
      annotations: {team: agents}
    spec:
      containers:
        - name: agent
          image: your-agent:1.0
      volumes:
        - name: scratch
          emptyDir: {}
"""
)


def test_the_sidecar_is_the_same_in_the_example_and_the_component():
    example = legate_container(example_deployment()["spec"]["template"]["spec"])
    component = legate_container(component_patch()["spec"]["template"]["spec"])
    assert example == component


def test_the_component_ships_the_configmaps_config():
    component_toml = (K8S / "sidecar" / "legate.toml").read_text(encoding="utf-8")
    assert component_toml == deploytool.configmap_toml_text()


@pytest.mark.parametrize("name,template", pod_specs())
def test_legate_is_a_native_sidecar_with_probes_on_the_admin_port(name, template):
    spec = template["spec"]
    config = deploytool.configmap_config()
    legate = legate_container(spec)
    assert legate["restartPolicy"] == "Always", name
    assert all(c["name"] != "legate" for c in spec.get("containers", [])), name
    assert legate["args"] == ["serve", "--config", "/etc/legate/legate.toml"]

    (admin_port,) = [p for p in legate["ports"] if p["containerPort"] == 9787]
    assert port_of(config["server"]["admin_listen"]) == admin_port["containerPort"]
    probes = {k: legate[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["startupProbe"]["path"] == "/readyz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert {p["port"] for p in probes.values()} == {admin_port["name"]}

    mounts = {m["mountPath"]: m["name"] for m in legate["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/etc/legate"]]["configMap"]["name"] == "legate-config"
    assert all(m.get("readOnly") for m in legate["volumeMounts"])


@pytest.mark.parametrize("name,template", pod_specs())
def test_key_files_are_in_the_mounted_secret(name, template):
    spec = template["spec"]
    legate = legate_container(spec)
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret_mounts = {
        m["mountPath"]
        for m in legate["volumeMounts"]
        if volumes[m["name"]].get("secret", {}).get("secretName") == SECRET_NAME
    }
    secret_keys = set(deploytool.load_yaml(K8S / "secret.example.yaml")["stringData"])
    files = deploytool.key_files(deploytool.configmap_config())
    assert files, "the pod's config reads its keys from files"
    for provider, path in files.items():
        assert posixpath.dirname(path) in secret_mounts, (name, provider, path)
        assert posixpath.basename(path) in secret_keys, (name, provider, path)


@pytest.mark.parametrize("name,template", pod_specs())
def test_grace_period_covers_shutdown_grace(name, template):
    grace = deploytool.parse_duration_seconds(
        deploytool.configmap_config()["server"].get("shutdown_grace", "30s")
    )
    assert template["spec"]["terminationGracePeriodSeconds"] >= grace + GRACE_MARGIN_S, name


def test_the_pod_config_keeps_the_data_plane_on_loopback():
    server = deploytool.configmap_config()["server"]
    assert ipaddress.ip_address(host_of(server["listen"])).is_loopback
    # Probes and Prometheus come from outside the pod's network namespace.
    assert host_of(server["admin_listen"]) == "0.0.0.0"


@pytest.mark.parametrize("name,template", pod_specs())
def test_scrape_annotations_name_the_admin_port(name, template):
    annotations = template["metadata"]["annotations"]
    admin = port_of(deploytool.configmap_config()["server"]["admin_listen"])
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(admin)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_the_agent_talks_to_legate_and_holds_no_provider_key():
    spec = example_deployment()["spec"]["template"]["spec"]
    (agent,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    port = port_of(deploytool.configmap_config()["server"]["listen"])
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"
    assert env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/v1"
    # The SDKs require a key to be set; legate ignores it.
    assert env["ANTHROPIC_API_KEY"] and env["OPENAI_API_KEY"]
    assert not any("valueFrom" in e for e in agent["env"])
    secret_volumes = {v["name"] for v in spec["volumes"] if "secret" in v}
    assert not secret_volumes & {m["name"] for m in agent.get("volumeMounts", [])}


@pytest.mark.parametrize("name,template", pod_specs())
def test_containers_are_locked_down(name, template):
    spec = template["spec"]
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    if name == "deployment.yaml":
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for c in containers:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault", c["name"]
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]


def test_podmonitor_selects_the_sidecar_pods_and_port():
    monitor = deploytool.load_yaml(K8S / "podmonitor.yaml")
    # kubernetes-validate has no schema for this CRD: check the fields it relies on.
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "PodMonitor"
    assert set(monitor["spec"]) <= {
        "selector",
        "podMetricsEndpoints",
        "namespaceSelector",
        "jobLabel",
    }
    selector = monitor["spec"]["selector"]["matchLabels"]
    for name, template in pod_specs():
        assert selector.items() <= template["metadata"]["labels"].items(), name
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= {"port", "path", "scheme", "interval", "scrapeTimeout"}
    port_names = {p["name"] for p in legate_container(pod_specs()[0][1]["spec"])["ports"]}
    assert endpoint["port"] in port_names
    assert endpoint["path"] == "/metrics"


def test_kustomizations_name_files_that_exist():
    example = deploytool.load_yaml(K8S / "kustomization.yaml")
    assert all((K8S / r).is_file() for r in example["resources"])
    component = deploytool.load_yaml(K8S / "sidecar" / "kustomization.yaml")
    assert component["kind"] == "Component"
    for patch in component["patches"]:
        assert (K8S / "sidecar" / patch["path"]).is_file()
        # The target selects by the label the component's users are told to set.
        assert patch["target"]["labelSelector"] == "legate-sidecar=true"
    for generator in component["configMapGenerator"]:
        assert generator["name"] == "legate-config"
        assert all((K8S / "sidecar" / f).is_file() for f in generator["files"])


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_the_component_patch_yields_a_valid_deployment(version):
    # With a patch target, kustomize ignores the patch's own metadata (its name is a placeholder).
    merged = strategic_merge(PLAIN_DEPLOYMENT, {"spec": component_patch()["spec"]})
    kubernetes_validate.validate(merged, version, strict=True)

    spec = merged["spec"]["template"]["spec"]
    # The workload keeps what it had, and gains the sidecar and its volumes.
    assert [c["name"] for c in spec["containers"]] == ["agent"]
    assert {v["name"] for v in spec["volumes"]} == {"scratch", "legate-config", SECRET_NAME}
    assert merged["spec"]["template"]["metadata"]["annotations"]["team"] == "agents"
    assert merged["spec"]["template"]["metadata"]["labels"]["app"] == "existing-agent"
    assert legate_container(spec)["restartPolicy"] == "Always"


def memory_bytes(quantity):
    """A Kubernetes memory quantity ("256Mi", "1Gi", "512M", "1000") in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(quantity))
    assert m, f"unsupported memory quantity {quantity!r}"
    factor = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
              "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2)]
    return int(m.group(1)) * factor


def configs_and_pods():
    """(name, legate's config, pod spec) for every pod that runs legate: the example, the
    component, and the cloud examples."""
    out = [
        ("deployment.yaml", deploytool.configmap_config(), example_deployment()["spec"]["template"]["spec"]),
        ("sidecar/legate.toml", tomllib.loads((K8S / "sidecar" / "legate.toml").read_text(encoding="utf-8")),
         component_patch()["spec"]["template"]["spec"]),
    ]
    for path in sorted((K8S / "cloud").glob("*.yaml")):
        with open(path, encoding="utf-8") as f:
            docs = {d["kind"]: d for d in yaml.safe_load_all(f) if d}
        out.append((f"cloud/{path.name}", tomllib.loads(docs["ConfigMap"]["data"]["legate.toml"]),
                    docs["Deployment"]["spec"]["template"]["spec"]))
    return out


def test_the_example_kustomization_leaves_the_secret_out():
    # `kubectl apply -k` must never replace the real keys with secret.example.yaml's placeholders.
    for resource in deploytool.load_yaml(K8S / "kustomization.yaml")["resources"]:
        with open(K8S / resource, encoding="utf-8") as f:
            kinds = {d["kind"] for d in yaml.safe_load_all(f) if d}
        assert "Secret" not in kinds, resource


LEGATE_PODS = configs_and_pods()


@pytest.mark.parametrize("name,config,spec", LEGATE_PODS, ids=[c[0] for c in LEGATE_PODS])
def test_legates_buffers_fit_its_memory_limit(name, config, spec):
    # Request bodies held in memory and upstream answers held whole each have a bound of
    # max_buffered_bytes: both full, legate must still be under the limit, so that it sheds
    # with 529 before the kubelet kills it.
    server = config.get("server", {})
    buffered = server.get("max_buffered_bytes", DEFAULT_MAX_BUFFERED_BYTES)
    limit = memory_bytes(legate_container(spec)["resources"]["limits"]["memory"])
    assert 2 * buffered + OWN_MEMORY_BYTES <= limit, (name, buffered, limit)
    assert server.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES) <= buffered, name


@pytest.mark.parametrize("name,config,spec", LEGATE_PODS, ids=[c[0] for c in LEGATE_PODS])
def test_claude_prices_cover_dated_snapshots(name, config, spec):
    # Clients send dated snapshots (claude-sonnet-4-5-20250929, Bedrock's ...-20250929-v1:0,
    # Vertex's ...@20250929): a Claude price is a prefix pattern, else they go unpriced. OpenAI
    # names stay exact: gpt-4o* would price gpt-4o-mini and gpt-4o-audio-preview as gpt-4o.
    for price in config.get("prices", []):
        provider, _, model = price["model"].partition(":")
        if "claude" in model:
            assert model.endswith("*"), (name, price["model"])
        elif config["providers"][provider].get("kind", provider) in ("openai", "azure-openai"):
            assert not model.endswith("*"), (name, price["model"])
