"""The pod-identity examples in deploy/kubernetes/cloud/ hold together: each Deployment runs as
the service account that carries the identity, the token the cloud's webhook projects is mounted
where legate's environment says it is (with the audience the cloud expects), and `legate check`
on the example's ConfigMap, in the pod's environment, names the credential source it documents.
kubernetes-validate checks their schemas in .ci/deploy-checks."""

import os
import subprocess
import tempfile

import pytest

import deploytool
from deploytool import K8S

CLOUD = K8S / "cloud"

# file -> (credential source legate check must name, projected audience or None)
EXAMPLES = {
    "eks-irsa.yaml": ("web identity", "sts.amazonaws.com"),
    "eks-pod-identity.yaml": ("container credentials endpoint", "pods.eks.amazonaws.com"),
    "gke-workload-identity.yaml": ("metadata server", None),
    "aks-workload-identity.yaml": ("Entra workload identity", "api://AzureADTokenExchange"),
}


# file -> the pod annotation naming the containers the identity webhook must leave alone; GKE's
# metadata server answers every container and has no such opt-out.
SKIP_ANNOTATIONS = {
    "eks-irsa.yaml": ("eks.amazonaws.com/skip-containers", ","),
    "eks-pod-identity.yaml": ("eks.amazonaws.com/skip-containers", ","),
    "aks-workload-identity.yaml": ("azure.workload.identity/skip-containers", ";"),
}


def docs(name):
    import yaml

    with open(CLOUD / name) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def legate_env(pod):
    sidecar = next(c for c in pod["initContainers"] if c["name"] == "legate")
    return sidecar, {e["name"]: e["value"] for e in sidecar.get("env", [])}


def test_every_example_is_covered():
    assert sorted(p.name for p in CLOUD.glob("*.yaml")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_pod_runs_as_the_identity_and_mounts_the_projected_token(name):
    d = docs(name)
    pod = d["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == d["ServiceAccount"]["metadata"]["name"]
    sidecar, env = legate_env(pod)
    audience = EXAMPLES[name][1]
    token_file = env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get(
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") or env.get("AZURE_FEDERATED_TOKEN_FILE")
    if audience is None:
        assert token_file is None
        return
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in sidecar["volumeMounts"]
                 if token_file.startswith(m["mountPath"].rstrip("/") + "/"))
    source = volumes[mount["name"]]["projected"]["sources"][0]["serviceAccountToken"]
    assert source["audience"] == audience
    assert token_file == f'{mount["mountPath"]}/{source["path"]}'


def test_annotations_name_the_identity_legate_uses():
    irsa = docs("eks-irsa.yaml")
    _, env = legate_env(irsa["Deployment"]["spec"]["template"]["spec"])
    assert irsa["ServiceAccount"]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == env["AWS_ROLE_ARN"]
    gke = docs("gke-workload-identity.yaml")
    assert gke["ServiceAccount"]["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com")
    aks = docs("aks-workload-identity.yaml")
    pod_labels = aks["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["azure.workload.identity/use"] == "true"
    _, env = legate_env(aks["Deployment"]["spec"]["template"]["spec"])
    assert aks["ServiceAccount"]["metadata"]["annotations"]["azure.workload.identity/client-id"] == env["AZURE_CLIENT_ID"]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_legate_check_names_the_documented_credential_source(name, legate_bin):
    d = docs(name)
    _, env = legate_env(d["Deployment"]["spec"]["template"]["spec"])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "legate.toml")
        with open(cfg, "w") as f:
            f.write(d["ConfigMap"]["data"]["legate.toml"])
        out = subprocess.run([str(legate_bin), "check", "--config", cfg], env={"PATH": os.environ.get("PATH", ""), **env},
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"# credentials: {EXAMPLES[name][0]}" in out.stdout, out.stdout
    assert "without a provider key" not in out.stderr


@pytest.mark.parametrize("name", sorted(SKIP_ANNOTATIONS))
def test_the_webhook_leaves_the_agent_without_the_identity(name):
    # The EKS and Azure webhooks inject the identity into every container the pod does not name:
    # only legate may hold it.
    template = docs(name)["Deployment"]["spec"]["template"]
    annotation, separator = SKIP_ANNOTATIONS[name]
    value = (template["metadata"].get("annotations") or {}).get(annotation, "")
    skipped = {n.strip() for n in value.split(separator)}
    assert {c["name"] for c in template["spec"]["containers"]} <= skipped, (name, value)
    assert "legate" not in skipped, name


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_legate_has_the_examples_probes(name):
    # The same probes as deployment.yaml. Without the readiness probe legate's container stays
    # ready while /readyz fails, and the LegateNotReady alert never fires for these pods.
    example = deploytool.load_yaml(deploytool.K8S / "deployment.yaml")
    reference, _ = legate_env(example["spec"]["template"]["spec"])
    sidecar, _ = legate_env(docs(name)["Deployment"]["spec"]["template"]["spec"])
    for probe in ("startupProbe", "readinessProbe"):
        assert sidecar.get(probe) == reference[probe], (name, probe)
    assert sidecar["livenessProbe"]["httpGet"] == reference["livenessProbe"]["httpGet"], name
