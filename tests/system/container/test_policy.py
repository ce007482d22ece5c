"""Container artifacts: every offline check passes on the shipped files and fails on a deliberately broken copy.

The broken copies are the shipped files with one or two lines changed, so a check that passes here is known to
look at the real thing, not at a toy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.system.container.policy import (
    build_command_problems,
    build_commands,
    compose_document,
    compose_problems,
    dockerfile_problems,
    kubernetes_problems,
)

ROOT = Path(__file__).resolve().parents[3]
CONTAINER = ROOT / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
README = ROOT / "docs" / "container.md"  # the page that writes the build out for people
COMPOSE = CONTAINER / "compose.yaml"
TRACING = CONTAINER / "tracing" / "compose.yaml"  # an override of COMPOSE: Jaeger beside the sidecar
KUBERNETES = CONTAINER / "kubernetes"
BIN = Path(sys.executable).parent  # the linters are test dependencies, installed beside this Python


def tool(name: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=ROOT)


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return tool("hadolint", "--no-color", "--config", CONTAINER / ".hadolint.yaml", path)


def yamllint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return tool("yamllint", "--strict", "--format", "parsable", "--config-file", CONTAINER / ".yamllint", *paths)


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    return tool("kubernetes-validate", "--strict", "--quiet", *paths)


def mutate(text: str, old: str, new: str) -> str:
    assert old in text, f"the shipped file no longer contains {old!r}: update this test"
    return text.replace(old, new, 1)


def broken_dockerfile(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    text = DOCKERFILE.read_text()
    for old, new in changes or [("USER 10001:10001", "USER root"), ('CMD ["crew-supervisor", "serve"]', "CMD serve")]:
        text = mutate(text, old, new)
    path = tmp_path / "Dockerfile"  # dockerfile-parse wants the name to end in "Dockerfile"
    path.write_text(text)
    return path


# --- Dockerfile --------------------------------------------------------------------------------------------------


def test_shipped_dockerfile_passes_hadolint_and_policy() -> None:
    assert hadolint(DOCKERFILE).returncode == 0, hadolint(DOCKERFILE).stdout
    assert dockerfile_problems(DOCKERFILE) == []


def test_broken_dockerfile_fails_hadolint_and_policy(tmp_path: Path) -> None:
    """Root user and a shell-form CMD: both linters see both."""
    path = broken_dockerfile(tmp_path)
    result = hadolint(path)
    assert result.returncode != 0
    assert "DL3002" in result.stdout  # last USER should not be root
    assert "DL3025" in result.stdout  # JSON notation for CMD
    problems = "\n".join(dockerfile_problems(path))
    assert "USER root must be a numeric, non-root uid" in problems
    assert "CMD must be exec form" in problems


DIGEST = re.search(r"@sha256:[0-9a-f]{64}", DOCKERFILE.read_text())
HEALTHCHECK = re.search(r"^HEALTHCHECK .*\n", DOCKERFILE.read_text(), re.MULTILINE)
DOCKERFILE_BREAKAGES = {
    "no USER": ("USER 10001:10001\n", "", "final stage has no USER"),
    "uid 0": ("USER 10001:10001", "USER 0:0", "non-root uid"),
    "no tini": ('ENTRYPOINT ["/usr/bin/tini", "--"]', 'ENTRYPOINT ["crew-supervisor"]', "ENTRYPOINT must be"),
    "shell entrypoint": ('ENTRYPOINT ["/usr/bin/tini", "--"]', "ENTRYPOINT /usr/bin/tini --", "ENTRYPOINT must be"),
    "ADD": ("COPY container/prepare.py", "ADD container/prepare.py", "ADD (use COPY"),
    "unpinned base": (DIGEST.group(0) if DIGEST else "@sha256:", "", "is not pinned by digest"),
    "unpinned stage": ("FROM ${BASE_IMAGE}\n", "FROM python:3.11-slim\n", "FROM python:3.11-slim is not pinned"),
    "no HEALTHCHECK": (HEALTHCHECK.group(0) if HEALTHCHECK else "HEALTHCHECK", "", "no HEALTHCHECK"),
    "HEALTHCHECK NONE": (
        HEALTHCHECK.group(0) if HEALTHCHECK else "HEALTHCHECK",
        "HEALTHCHECK NONE\n",
        "no HEALTHCHECK",
    ),
    "shell HEALTHCHECK": ('CMD ["crew-supervisor-healthcheck"]', "CMD crew-supervisor-healthcheck", "exec form"),
    "ENV token": ("PYTHONUNBUFFERED=1 \\", "PYTHONUNBUFFERED=1 AIP_CREWAI_BEARER_TOKEN=hunter2 \\", "secret-like"),
    "ARG key": ("ARG CREWAI_VERSION=1.15.30\n", "ARG CREWAI_VERSION=1.15.30\nARG OPENAI_API_KEY=sk-1\n", "secret"),
    "COPY .env": ("COPY container/prepare.py", "COPY .env /etc/app.env\nCOPY container/prepare.py", "secret"),
    "pip from index": (" --no-index \\\n", " \\\n", "pip install without --no-index"),
    "telemetry on": ("CREWAI_DISABLE_TELEMETRY=true", "CREWAI_DISABLE_TELEMETRY=false", "telemetry must be off"),
    "tracing silenced": (
        "CREWAI_DISABLE_TELEMETRY=true \\\n",
        "CREWAI_DISABLE_TELEMETRY=true \\\n    OTEL_SDK_DISABLED=true \\\n",
        "ENV OTEL_SDK_DISABLED set",
    ),
    "journal off volume": ("STATE_FILE=/var/lib/crew-supervisor/", "STATE_FILE=/srv/", "STATE_FILE must be under"),
    "loopback": ("AIP_CREWAI_HOST=0.0.0.0", "AIP_CREWAI_HOST=127.0.0.1", "AIP_CREWAI_HOST=0.0.0.0 missing"),
    "no label": (' \\\n      io.crewai.version="${CREWAI_VERSION}"', "", "LABEL io.crewai.version missing"),
    "pip kept": (" uv setuptools pip \\\n", " uv setuptools \\\n", "uninstall pip and uv"),
    "uv kept": (" uv setuptools pip \\\n", " setuptools pip \\\n", "uninstall pip and uv"),
    "uninstall before check": (
        "    && /opt/crew-supervisor/bin/pip check \\\n",
        "    && /opt/crew-supervisor/bin/pip uninstall --yes uv pip \\\n    && /opt/crew-supervisor/bin/pip check \\\n",
        "before pip check",
    ),
}


@pytest.mark.parametrize("case", DOCKERFILE_BREAKAGES)
def test_dockerfile_policy_catches(case: str, tmp_path: Path) -> None:
    old, new, expected = DOCKERFILE_BREAKAGES[case]
    problems = dockerfile_problems(broken_dockerfile(tmp_path, (old, new)))
    assert any(expected in problem for problem in problems), problems


def test_files_the_dockerfile_copies_are_in_the_build_context() -> None:
    """Each COPY source exists, the scripts are executable (COPY keeps the mode), and .dockerignore lets it in."""
    allowed = [line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"]
    for source in re.findall(r"^COPY (container/\S+)", DOCKERFILE.read_text(), re.MULTILINE):
        assert os.access(ROOT / source, os.X_OK), source
        assert source in allowed, source
    assert "build/wheelhouse" in allowed


# Every place a build of container/Dockerfile is written out for someone to run.
BUILD_COMMAND_FILES = (README, DOCKERFILE, ROOT / "scripts" / "smoke-container", ROOT / "scripts" / "wheelhouse")


def test_written_out_builds_pass_every_wheelhouse_build_arg() -> None:
    for path in BUILD_COMMAND_FILES:
        assert build_commands(path.read_text()), path  # the check looks at a build command in each
        assert build_command_problems(path) == [], path
    assert len(build_commands(README.read_text())) == 2  # docker build and the podman smoke test's


BUILD_COMMAND_BREAKAGES = {
    "podman line without CREWAI_VERSION": (
        README,
        ' \\\n  --build-arg CREWAI_VERSION="$(cat build/wheelhouse/CREWAI_VERSION)" -t localhost/',
        " -t localhost/",
        "podman build --layers=false",
    ),
    "docker line without SOURCE_REVISION": (
        README,
        '  --build-arg SOURCE_REVISION="$(cat build/wheelhouse/SOURCE_REVISION)" \\\n  --build-arg CREWAI_VERSION',
        "  --build-arg CREWAI_VERSION",
        "docker build -f container/Dockerfile -t crew-supervisor:0.1.0 \\ ... lacks --build-arg SOURCE_REVISION=",
    ),
    "Dockerfile header without CREWAI_VERSION": (
        DOCKERFILE,
        '#     --build-arg CREWAI_VERSION="$(cat build/wheelhouse/CREWAI_VERSION)" -t',
        "#     -t",
        "lacks --build-arg CREWAI_VERSION=",
    ),
}


@pytest.mark.parametrize("case", BUILD_COMMAND_BREAKAGES)
def test_build_command_policy_catches(case: str, tmp_path: Path) -> None:
    path, old, new, expected = BUILD_COMMAND_BREAKAGES[case]
    copy = tmp_path / path.name
    copy.write_text(mutate(path.read_text(), old, new))
    problems = build_command_problems(copy)
    assert any(expected in problem for problem in problems), problems


# --- YAML: compose and Kubernetes --------------------------------------------------------------------------------


def test_shipped_yaml_passes_yamllint() -> None:
    result = yamllint(CONTAINER)
    assert result.returncode == 0, result.stdout


def test_broken_yaml_fails_yamllint(tmp_path: Path) -> None:
    """A duplicated key silently wins in most loaders: here it would turn the read-only root off."""
    path = tmp_path / "compose.yaml"
    path.write_text(mutate(COMPOSE.read_text(), "    read_only: true", "    read_only: true\n    read_only: false"))
    result = yamllint(path)
    assert result.returncode != 0
    assert "key-duplicates" in result.stdout
    assert any("read_only must be true" in problem for problem in compose_problems(path))


def test_shipped_compose_passes_policy() -> None:
    assert compose_problems(COMPOSE) == []


COMPOSE_BREAKAGES = {
    "published beyond loopback": ('"127.0.0.1:8090:8090"', '"8090:8090"', "beyond loopback"),
    "all interfaces": ('"127.0.0.1:8090:8090"', '"0.0.0.0:8090:8090"', "beyond loopback"),
    "writable root": ("read_only: true", "read_only: false", "read_only must be true"),
    "capabilities kept": ("cap_drop: [ALL]", "cap_drop: [NET_RAW]", "cap_drop must be [ALL]"),
    "new privileges": ('security_opt: ["no-new-privileges:true"]', "security_opt: []", "no-new-privileges"),
    "no tmpfs": ("      - /tmp:rw", "      - /scratch:rw", "tmpfs /tmp missing"),
    "no pids limit": ("    pids_limit: 512\n", "", "pids_limit and mem_limit"),
    "root": ('user: "10001:10001"', 'user: "0:0"', "non-root uid"),
    "short grace": ("stop_grace_period: 30s", "stop_grace_period: 5s", "stop_grace_period below"),
    "drain as long as the grace": (
        'AIP_CREWAI_DRAIN_SECONDS: "20"',
        'AIP_CREWAI_DRAIN_SECONDS: "30"',
        "stop_grace_period below 40s",
    ),
    "token inline": (
        "AIP_CREWAI_BEARER_TOKEN_FILE: /run/secrets/crew-supervisor-token",
        "AIP_CREWAI_BEARER_TOKEN: x",
        "token",
    ),
    "bind mount": ("- state:/var/lib/crew-supervisor", "- ./state:/var/lib/crew-supervisor", "named volume"),
    "no restart": ("restart: unless-stopped", 'restart: "no"', "restart policy"),
}


@pytest.mark.parametrize("case", COMPOSE_BREAKAGES)
def test_compose_policy_catches(case: str, tmp_path: Path) -> None:
    old, new, expected = COMPOSE_BREAKAGES[case]
    path = tmp_path / "compose.yaml"
    path.write_text(mutate(COMPOSE.read_text(), old, new))
    problems = compose_problems(path)
    assert any(expected in problem for problem in problems), problems


def test_shipped_tracing_recipe_passes_policy() -> None:
    """Merged over the base file, as the recipe's command runs it: the sidecar keeps every rule, Jaeger the
    hardening every service keeps."""
    assert compose_problems(COMPOSE, TRACING) == []


def test_tracing_recipe_addresses_agree() -> None:
    """The sidecar exports to the Jaeger service's OTLP/HTTP port, its trace links open the UI the recipe
    publishes on loopback, and the base file's settings are still there beside the override's."""
    document, _ = compose_document(COMPOSE, TRACING)
    sidecar, jaeger = document["services"]["crew-supervisor"], document["services"]["jaeger"]
    environment = sidecar["environment"]
    assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert environment["AIP_CREWAI_BEARER_TOKEN_FILE"] == "/run/secrets/crew-supervisor-token"
    link = environment["AIP_CREWAI_TRACE_UI_URL"]
    assert "{trace_id}" in link
    assert link.startswith("http://localhost:16686/") and "127.0.0.1:16686:16686" in jaeger["ports"]


def tracing_override(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "compose.tracing.yaml"
    path.write_text(mutate(TRACING.read_text(), old, new))
    return path


TRACING_BREAKAGES = {
    "UI beyond loopback": ('"127.0.0.1:16686:16686"', '"16686:16686"', "service jaeger: port 16686:16686"),
    "jaeger writable": ("read_only: true  # it keeps", "read_only: false  # it keeps", "jaeger: read_only"),
    "jaeger as root": ('user: "10001:10001"', 'user: "0:0"', "service jaeger: user must be a non-root uid"),
    "jaeger capabilities": ("cap_drop: [ALL]", "cap_drop: []", "service jaeger: cap_drop must be [ALL]"),
    "jaeger unbounded": ("    pids_limit: 256\n", "", "service jaeger: pids_limit and mem_limit"),
    "tracing silently off": (
        "      OTEL_SERVICE_NAME:",
        '      OTEL_SDK_DISABLED: "true"\n      OTEL_SERVICE_NAME:',
        "OTEL_SDK_DISABLED true beside an OTLP endpoint",
    ),
    "exporter headers written": (
        "      OTEL_SERVICE_NAME:",
        '      OTEL_EXPORTER_OTLP_HEADERS: "x-honeycomb-team=hc-key"\n      OTEL_SERVICE_NAME:',
        "OTEL_EXPORTER_OTLP_HEADERS is written into the compose file",
    ),
    "a list set again": (
        "    depends_on: [jaeger]\n",
        '    depends_on: [jaeger]\n    ports: ["127.0.0.1:8091:8090"]\n',
        "services: crew-supervisor: ports set again by a later file",
    ),
}


@pytest.mark.parametrize("case", TRACING_BREAKAGES)
def test_tracing_recipe_policy_catches(case: str, tmp_path: Path) -> None:
    old, new, expected = TRACING_BREAKAGES[case]
    problems = compose_problems(COMPOSE, tracing_override(tmp_path, old, new))
    assert any(expected in problem for problem in problems), problems


def test_headers_from_the_engines_environment_pass(tmp_path: Path) -> None:
    """A key the engine fills in from its own environment is not written in the file."""
    header = '      OTEL_EXPORTER_OTLP_HEADERS: "${OTLP_HEADERS}"\n      OTEL_SERVICE_NAME:'
    assert compose_problems(COMPOSE, tracing_override(tmp_path, "      OTEL_SERVICE_NAME:", header)) == []


def test_shipped_manifests_pass_kubernetes_validate_and_policy() -> None:
    manifests = sorted(KUBERNETES.glob("*.yaml"))
    result = kubernetes_validate(*manifests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert kubernetes_problems(KUBERNETES) == []


def broken_manifests(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """The shipped manifests, one document per file, after ``change`` edited them (keyed by kind)."""
    documents = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            documents[document["kind"]] = document
    change(documents)
    for kind, document in documents.items():
        (tmp_path / f"{kind.lower()}.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return tmp_path


def _pod(documents: dict[str, Any]) -> dict[str, Any]:
    return documents["StatefulSet"]["spec"]["template"]["spec"]


def _main(documents: dict[str, Any]) -> dict[str, Any]:
    return _pod(documents)["containers"][0]


def _strip_security_contexts(documents: dict[str, Any]) -> None:
    pod = _pod(documents)
    del pod["securityContext"]
    for container in pod["containers"] + pod["initContainers"]:
        del container["securityContext"]


def test_manifests_without_security_context_fail_policy(tmp_path: Path) -> None:
    """Schema-valid (a securityContext is optional), so only the project's own policy can catch this."""
    directory = broken_manifests(tmp_path, _strip_security_contexts)
    assert kubernetes_validate(*sorted(directory.glob("*.yaml"))).returncode == 0
    problems = "\n".join(kubernetes_problems(directory))
    for expected in (
        "pod securityContext.runAsNonRoot must be true",
        "pod securityContext.runAsUser must be a non-root id",
        "pod securityContext.fsGroup must be a non-root id",
        "container crew-supervisor: securityContext.readOnlyRootFilesystem must be true",
        "container crew-supervisor: securityContext.allowPrivilegeEscalation must be false",
        "container crew-supervisor: securityContext.capabilities must drop ALL",
        "container crew-supervisor: seccompProfile must be RuntimeDefault",
        "initContainer prepare: securityContext.readOnlyRootFilesystem must be true",
    ):
        assert expected in problems


def test_misspelled_field_fails_kubernetes_validate(tmp_path: Path) -> None:
    """A typo that a lenient apply drops silently, leaving the root filesystem writable."""

    def misspell(documents: dict[str, Any]) -> None:
        context = _main(documents)["securityContext"]
        context["readOnlyRootFileSystem"] = context.pop("readOnlyRootFilesystem")

    directory = broken_manifests(tmp_path, misspell)
    result = kubernetes_validate(directory / "statefulset.yaml")
    assert result.returncode != 0
    assert "readOnlyRootFileSystem" in result.stdout + result.stderr
    assert any("readOnlyRootFilesystem must be true" in problem for problem in kubernetes_problems(directory))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit at ``Kind.key.key...`` (``~`` deletes); ``pod.`` and ``main.`` start at the pod spec / container."""

    def change(documents: dict[str, Any]) -> None:
        first, *keys = path.split(".")
        node = {"pod": _pod, "main": _main}.get(first, lambda d: d[first])(documents)
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        last = int(keys[-1]) if isinstance(node, list) else keys[-1]
        if value == "~":
            del node[last]
        else:
            node[last] = value

    return change


KUBERNETES_BREAKAGES = {
    "shared volume": (
        _set("pod.volumes", [{"name": "state", "persistentVolumeClaim": {"claimName": "shared"}}]),
        "shared by every replica",
    ),
    "no claim templates": (_set("StatefulSet.spec.volumeClaimTemplates", []), "volumeClaimTemplates"),
    "http probe": (_set("main.livenessProbe", {"httpGet": {"path": "/health", "port": 8090}}), "exec probe"),
    "no readiness": (_set("main.readinessProbe", "~"), "readinessProbe must be an exec probe"),
    "no limits": (_set("main.resources.limits", "~"), "resources.limits.memory missing"),
    "short grace": (_set("pod.terminationGracePeriodSeconds", 5), "terminationGracePeriodSeconds below"),
    "drain as long as the grace": (
        _set("main.env.3", {"name": "AIP_CREWAI_DRAIN_SECONDS", "value": "30"}),
        "terminationGracePeriodSeconds below 40",
    ),
    "group-readable secret": (_set("pod.volumes.2.secret.defaultMode", 0o440), "defaultMode must be 0400"),
    "fsGroup on every mount": (_set("pod.securityContext.fsGroupChangePolicy", "Always"), "OnRootMismatch"),
    "api token": (_set("pod.automountServiceAccountToken", True), "automountServiceAccountToken"),
    "token in manifest": (_set("main.env.1", {"name": "AIP_CREWAI_BEARER_TOKEN", "value": "x"}), "into the manifest"),
    "root user": (_set("main.securityContext.runAsUser", 0), "runAsUser 0"),
    "host network": (_set("pod.hostNetwork", True), "pod hostNetwork"),
    "tmp on root": (_set("main.volumeMounts.1.mountPath", "/scratch"), "/tmp must be an emptyDir"),
    "load-balanced": (_set("Service.spec.clusterIP", "~"), "headless"),
    "open ingress": (_set("NetworkPolicy.spec.ingress.0.from", []), "only from labelled host pods"),
    "any pod": (_set("NetworkPolicy.spec.ingress.0.from", [{"podSelector": {}}]), "only from labelled host pods"),
}


@pytest.mark.parametrize("case", KUBERNETES_BREAKAGES)
def test_kubernetes_policy_catches(case: str, tmp_path: Path) -> None:
    change, expected = KUBERNETES_BREAKAGES[case]
    problems = kubernetes_problems(broken_manifests(tmp_path, change))
    assert any(expected in problem for problem in problems), problems
