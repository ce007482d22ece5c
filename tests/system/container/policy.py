"""The project's own container policy: what hadolint, yamllint and schema validation do not know about us.

Each check returns a list of problems (empty when the file complies), so a test can show both that the shipped
files pass and that a broken copy fails with the expected problem.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser

from protocol import CREWAI_SWITCHES

VOLUME = "/var/lib/crew-supervisor"
PINNED = re.compile(r"^[^\s@$]+@sha256:[0-9a-f]{64}$")
SECRETISH = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE_?KEY|CREDENTIAL", re.IGNORECASE)
SECRET_FILES = re.compile(r"(^|/)(\.env|.*\.pem|.*\.key|id_[rd]sa.*|.*token.*|.*secret.*)$", re.IGNORECASE)
DURABLE = ("HOME", "CREWAI_STORAGE_DIR", "AIP_CREWAI_STATE_FILE", "AIP_CREWAI_TRAINING_DIR")
DEFAULT_DRAIN_SECONDS = 20.0  # AIP_CREWAI_DRAIN_SECONDS' default: running jobs may finish this long after SIGTERM
# After the drain: the jobs left are killed and confirmed, uvicorn gives connections up to 5 s, the journal closes.
STOP_SECONDS = 10
# The build arguments the Dockerfile checks against the wheelhouse (build/wheelhouse/<NAME>): a build command that
# leaves one out builds with the Dockerfile's default, and fails as soon as the wheelhouse says otherwise.
WHEELHOUSE_ARGS = ("SOURCE_REVISION", "CREWAI_VERSION")
# A build of container/Dockerfile written out (docs, scripts, the Dockerfile's own header), with its continuations.
BUILD_COMMAND = re.compile(r"\b(?:docker|podman) build\b(?:[^\n]*\\\n)*[^\n]*")
# The OTLP exporter's variables (docs/tracing.md) a compose file may set for the sidecar, and may not write out.
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
OTLP_HEADERS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
SDK_OFF = "OTEL_SDK_DISABLED"  # the supervisor's tracing off, whatever endpoint is set


# --- Dockerfile --------------------------------------------------------------------------------------------------


def _pairs(value: str) -> dict[str, str]:
    """ENV/LABEL/ARG arguments: ``K=V K2="V 2"`` or the legacy ``K V``."""
    words = shlex.split(value)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(word.partition("=")[::2] for word in words)


def _exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) and all(isinstance(x, str) for x in parsed) else None


def dockerfile_problems(path: Path) -> list[str]:
    parser = DockerfileParser(path=str(path), env_replace=False)  # the path must end in "Dockerfile"
    problems: list[str] = []
    global_args: dict[str, str] = {}
    stages: list[list[dict[str, Any]]] = []
    names: set[str] = set()
    for item in parser.structure:
        instruction, value, line = item["instruction"], item["value"], item["startline"] + 1
        if instruction == "FROM":
            words = [word for word in value.split() if not word.startswith("--")]  # drop --platform=...
            image, alias = words[0], words[2] if len(words) > 2 and words[1].lower() == "as" else ""
            base = global_args.get(image.strip("${}"), "") if image.startswith("$") else image
            if image not in names and not PINNED.match(base):
                problems.append(f"line {line}: FROM {image} is not pinned by digest (name@sha256:...)")
            names.add(alias)
            stages.append([])
            continue
        if not stages:
            if instruction == "ARG":
                global_args.update(_pairs(value))
            continue
        stages[-1].append(item)
        if instruction == "ADD":
            problems.append(f"line {line}: ADD (use COPY: no remote fetches, no archive surprises)")
        if instruction in ("ENV", "ARG"):
            for name, setting in _pairs(value).items():
                if SECRETISH.search(name) and setting:
                    problems.append(f"line {line}: {instruction} {name} bakes a secret-like value into the image")
        if instruction == "COPY":
            for source in shlex.split(value)[:-1]:
                if not source.startswith("--") and SECRET_FILES.search(source.rstrip("/")):
                    problems.append(f"line {line}: COPY {source} looks like a secret")
        if instruction == "RUN" and re.search(r"\bpip3? install\b", value) and "--no-index" not in value:
            problems.append(f"line {line}: pip install without --no-index (install from the wheelhouse only)")
    if not stages:
        return [*problems, "no FROM"]
    final = stages[-1]
    problems += _venv_problems([item for stage in stages[:-1] for item in stage])

    def last(instruction: str) -> dict[str, Any] | None:
        found = [item for item in final if item["instruction"] == instruction]
        return found[-1] if found else None

    user = last("USER")
    if user is None:
        problems.append("final stage has no USER: it would run as root")
    else:
        ids = user["value"].strip().split(":")
        if not all(part.isdigit() and int(part) > 0 for part in ids):
            problems.append(f"USER {user['value']} must be a numeric, non-root uid[:gid] (runAsNonRoot needs numbers)")
    entrypoint = last("ENTRYPOINT")
    words = _exec_form(entrypoint["value"]) if entrypoint else None
    if not words or PurePosixPath(words[0]).name != "tini" or "--" not in words:
        problems.append('ENTRYPOINT must be exec-form tini, e.g. ["/usr/bin/tini", "--"] (zombie reaping)')
    cmd = last("CMD")
    if cmd is None or not _exec_form(cmd["value"]):
        problems.append("CMD must be exec form (a JSON array): a shell would be the one receiving SIGTERM")
    health = last("HEALTHCHECK")
    if health is None or health["value"].strip().upper() == "NONE":
        problems.append("no HEALTHCHECK")
    elif not _exec_form(re.sub(r"^(--\S+\s+)*CMD\s+", "", health["value"].strip())):
        problems.append("HEALTHCHECK must be exec form: CMD [...]")
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    volumes: list[str] = []
    for item in final:
        if item["instruction"] == "ENV":
            env.update(_pairs(item["value"]))
        elif item["instruction"] == "LABEL":
            labels.update(_pairs(item["value"]))
        elif item["instruction"] == "VOLUME":
            volumes += _exec_form(item["value"]) or item["value"].split()
    for name, wanted in CREWAI_SWITCHES.items():
        if env.get(name) != wanted:
            problems.append(f"ENV {name}={wanted} missing (CrewAI telemetry must be off)")
    if SDK_OFF in env:  # the workers set it for themselves; the supervisor's would silence its tracing
        problems.append(f"ENV {SDK_OFF} set: an OTLP endpoint alone must turn the supervisor's tracing on")
    if VOLUME not in volumes:
        problems.append(f"no VOLUME {VOLUME}")
    for name in DURABLE:
        if not env.get(name, "").startswith(VOLUME + "/"):
            problems.append(f"ENV {name} must be under the volume {VOLUME}")
    if env.get("AIP_CREWAI_HOST") != "0.0.0.0":
        problems.append("ENV AIP_CREWAI_HOST=0.0.0.0 missing (loopback inside a container is unreachable)")
    for label in ("org.opencontainers.image.revision", "io.crewai.version"):
        if not labels.get(label):
            problems.append(f"LABEL {label} missing")
    return problems


def _venv_problems(build: list[dict[str, Any]]) -> list[str]:
    """The build stages' RUNs: pip and uv must leave the venv the runtime copies, and only after `pip check`
    (crewai-cli requires uv: checked without it, the set would not be consistent)."""
    commands = " && ".join(item["value"] for item in build if item["instruction"] == "RUN")
    uninstall = re.search(r"\bpip uninstall\b([^&;|]*)", commands)
    if uninstall is None or not {"pip", "uv"} <= set(uninstall.group(1).split()):
        return ["the build stage must uninstall pip and uv from the venv: the runtime runs neither"]
    check = commands.find("pip check")
    if check < 0 or check > uninstall.start():
        return ["pip uninstall before pip check: check the whole locked set first"]
    return []


def build_commands(text: str) -> list[str]:
    return [command for command in BUILD_COMMAND.findall(text) if "container/Dockerfile" in command]


def build_command_problems(path: Path) -> list[str]:
    """Each build command written out in ``path`` passes every wheelhouse build argument."""
    return [
        f"{path.name}: {command.splitlines()[0].strip()} ... lacks --build-arg {name}="
        for command in build_commands(path.read_text())
        for name in WHEELHOUSE_ARGS
        if f"--build-arg {name}=" not in command
    ]


# --- Kubernetes --------------------------------------------------------------------------------------------------


def _documents(directory: Path) -> list[dict[str, Any]]:
    return [doc for path in sorted(directory.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def _container_problems(where: str, container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    problems = []
    context = container.get("securityContext") or {}
    pod_context = pod.get("securityContext") or {}
    if context.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{where}: securityContext.readOnlyRootFilesystem must be true")
    if context.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: securityContext.allowPrivilegeEscalation must be false")
    if context.get("privileged"):
        problems.append(f"{where}: privileged")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []) or capabilities.get("add"):
        problems.append(f"{where}: securityContext.capabilities must drop ALL and add none")
    if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
        problems.append(f"{where}: runAsNonRoot must be true")
    if context.get("runAsUser", 1) == 0:
        problems.append(f"{where}: runAsUser 0")
    seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile") or {}
    if seccomp.get("type") != "RuntimeDefault":
        problems.append(f"{where}: seccompProfile must be RuntimeDefault")
    resources = container.get("resources") or {}
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            if resource not in (resources.get(kind) or {}):
                problems.append(f"{where}: resources.{kind}.{resource} missing")
    for variable in container.get("env") or []:
        if variable.get("name") == "AIP_CREWAI_BEARER_TOKEN" and "value" in variable:
            problems.append(f"{where}: the bearer token is written into the manifest")
    return problems


def kubernetes_problems(directory: Path) -> list[str]:
    documents = _documents(directory)
    by_kind = {doc.get("kind"): doc for doc in documents}
    problems = [f"no {kind}" for kind in ("StatefulSet", "Service", "NetworkPolicy") if kind not in by_kind]
    service = by_kind.get("Service")
    if service and service["spec"].get("clusterIP") != "None":
        problems.append("Service must be headless (clusterIP: None): each replica is its own instance")
    policy = by_kind.get("NetworkPolicy")
    if policy:
        spec = policy["spec"]
        if "Ingress" not in (spec.get("policyTypes") or []) or not spec.get("podSelector", {}).get("matchLabels"):
            problems.append("NetworkPolicy must select the supervisor's pods and govern Ingress")
        for rule in spec.get("ingress") or []:
            sources = rule.get("from") or []
            if not sources or any(not (source.get("podSelector") or {}).get("matchLabels") for source in sources):
                problems.append("NetworkPolicy ingress must come only from labelled host pods (podSelector)")
            if not rule.get("ports"):
                problems.append("NetworkPolicy ingress must name its ports")
    statefulset = by_kind.get("StatefulSet")
    if not statefulset:
        return problems
    spec = statefulset["spec"]
    pod = spec["template"]["spec"]
    claims = {claim["metadata"]["name"] for claim in spec.get("volumeClaimTemplates") or []}
    if not claims:
        problems.append("StatefulSet needs volumeClaimTemplates: one volume per replica")
    if any("persistentVolumeClaim" in volume for volume in pod.get("volumes") or []):
        problems.append("a pod-level persistentVolumeClaim would be shared by every replica")
    context = pod.get("securityContext") or {}
    if context.get("runAsNonRoot") is not True:
        problems.append("pod securityContext.runAsNonRoot must be true")
    for field in ("runAsUser", "runAsGroup", "fsGroup"):
        if not isinstance(context.get(field), int) or context[field] <= 0:
            problems.append(f"pod securityContext.{field} must be a non-root id")
    if context.get("fsGroupChangePolicy") != "OnRootMismatch":
        problems.append("pod securityContext.fsGroupChangePolicy must be OnRootMismatch (else: journal 0660)")
    if (context.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        problems.append("pod securityContext.seccompProfile must be RuntimeDefault")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"pod {flag}")
    if pod.get("automountServiceAccountToken") is not False:
        problems.append("automountServiceAccountToken must be false")
    grace = pod.get("terminationGracePeriodSeconds") or 30
    for container in pod.get("containers") or []:
        env = {v.get("name"): v.get("value") for v in container.get("env") or []}
        if (needed := _stop_seconds(env)) > grace:
            problems.append(f"terminationGracePeriodSeconds below {needed:g} (the drain plus {STOP_SECONDS} s)")
    volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
    for volume in volumes.values():
        if "secret" in volume and volume["secret"].get("defaultMode") != 0o400:
            problems.append(f"secret volume {volume['name']}: defaultMode must be 0400")
    for container in pod.get("initContainers") or []:
        problems += _container_problems(f"initContainer {container['name']}", container, pod)
    for container in pod.get("containers") or []:
        where = f"container {container['name']}"
        problems += _container_problems(where, container, pod)
        for probe in ("livenessProbe", "readinessProbe"):
            if "exec" not in (container.get(probe) or {}):
                problems.append(f"{where}: {probe} must be an exec probe (it reads the token file)")
        mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts") or []}
        if mounts.get(VOLUME) not in claims:
            problems.append(f"{where}: {VOLUME} must come from a volumeClaimTemplate")
        if "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
            problems.append(f"{where}: /tmp must be an emptyDir")
        if not any(v.get("name") == "AIP_CREWAI_BEARER_TOKEN_FILE" for v in container.get("env") or []):
            problems.append(f"{where}: AIP_CREWAI_BEARER_TOKEN_FILE not set")
    return problems


# --- compose -----------------------------------------------------------------------------------------------------


def _seconds(duration: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", str(duration))
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 0.000001}
    return sum(float(number) * scale[unit] for number, unit in parts)


def _stop_seconds(environment: dict[str, Any]) -> float:
    """How long a SIGTERM'd supervisor may take: its drain (as configured, else the default), then the stop."""
    drain = environment.get("AIP_CREWAI_DRAIN_SECONDS")
    return (DEFAULT_DRAIN_SECONDS if drain is None else float(drain)) + STOP_SECONDS


def compose_document(*paths: Path) -> tuple[dict[str, Any], list[str]]:
    """The files merged as compose merges them (each later file's mappings into the earlier's, key by key, a later
    scalar winning), and the problems of the merge: a list set again by a later file is one, since compose
    appends some lists and replaces others, so no check here could say which one the engine would run."""
    document: dict[str, Any] = {}
    problems: list[str] = []
    for path in paths:
        document = _merged(document, yaml.safe_load(path.read_text()) or {}, path.name, problems)
    return document, problems


def _merged(base: dict[str, Any], later: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in later.items():
        earlier = merged.get(key)
        if isinstance(earlier, dict) and isinstance(value, dict):
            merged[key] = _merged(earlier, value, f"{where}: {key}", problems)
            continue
        if key in merged and (isinstance(earlier, list) or isinstance(value, list)):
            problems.append(f"{where}: {key} set again by a later file (append or replace? keep it in one file)")
        merged[key] = value
    return merged


def _environment(service: dict[str, Any]) -> dict[str, Any]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(entry.partition("=")[::2] for entry in environment)
    return dict(environment)


def _is_sidecar(service: dict[str, Any]) -> bool:
    """A service running crew-supervisor: its image, or a setting of ours in its environment."""
    return "crew-supervisor" in str(service.get("image", "")) or any(
        name.startswith("AIP_CREWAI_") for name in _environment(service)
    )


def compose_problems(*paths: Path) -> list[str]:
    """The compose files, merged in order (a base and its overrides): every service hardened, the sidecar's own
    rules for each service running crew-supervisor."""
    document, problems = compose_document(*paths)
    for name, service in (document.get("services") or {}).items():
        problems += _service_problems(f"service {name}", service)
        if _is_sidecar(service):
            problems += _sidecar_problems(f"service {name}", service, document)
    for name, secret in (document.get("secrets") or {}).items():
        if "file" not in secret:
            problems.append(f"secret {name} must come from a file")
    return problems


def _service_problems(where: str, service: dict[str, Any]) -> list[str]:
    """What every service of ours keeps, the sidecar and what runs beside it alike."""
    problems = []
    if service.get("read_only") is not True:
        problems.append(f"{where}: read_only must be true")
    if "ALL" not in (service.get("cap_drop") or []) or service.get("cap_add"):
        problems.append(f"{where}: cap_drop must be [ALL], no cap_add")
    if "no-new-privileges:true" not in (service.get("security_opt") or []):
        problems.append(f"{where}: security_opt no-new-privileges:true missing")
    if not any(str(entry).split(":")[0] == "/tmp" for entry in service.get("tmpfs") or []):
        problems.append(f"{where}: tmpfs /tmp missing")
    if not service.get("pids_limit") or not service.get("mem_limit"):
        problems.append(f"{where}: pids_limit and mem_limit required")
    if service.get("privileged") or service.get("network_mode") == "host" or service.get("pid") == "host":
        problems.append(f"{where}: privileged or host namespaces")
    if str(service.get("user", "0")).split(":")[0] in ("0", "root", ""):
        problems.append(f"{where}: user must be a non-root uid")
    if service.get("restart") in (None, "no"):
        problems.append(f"{where}: restart policy missing")
    for port in service.get("ports") or []:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).rsplit(":", 2)[0]
        if not str(host_ip).startswith("127."):
            problems.append(f"{where}: port {port} is published beyond loopback")
    if any("docker.sock" in mount for mount in _mounts(service)):
        problems.append(f"{where}: the container engine's socket is mounted")
    for name, value in _environment(service).items():
        # An exporter's headers often hold a vendor's key: from the engine's environment (${...}), never written.
        if name in OTLP_HEADERS and value and not str(value).startswith("${"):
            problems.append(f"{where}: {name} is written into the compose file (it may hold a key)")
    return problems


def _mounts(service: dict[str, Any]) -> list[str]:
    return [
        str(volume) if not isinstance(volume, dict) else f"{volume.get('source')}:{volume.get('target')}"
        for volume in service.get("volumes") or []
    ]


def _sidecar_problems(where: str, service: dict[str, Any], document: dict[str, Any]) -> list[str]:
    problems = []
    environment = _environment(service)
    if (needed := _stop_seconds(environment)) > _seconds(service.get("stop_grace_period", "10s")):
        problems.append(f"{where}: stop_grace_period below {needed:g}s (the drain plus {STOP_SECONDS} s)")
    if environment.get("AIP_CREWAI_BEARER_TOKEN"):
        problems.append(f"{where}: the bearer token is written into the compose file")
    if not str(environment.get("AIP_CREWAI_BEARER_TOKEN_FILE", "")).startswith("/run/secrets/"):
        problems.append(f"{where}: AIP_CREWAI_BEARER_TOKEN_FILE must name a secret under /run/secrets/")
    if not service.get("secrets"):
        problems.append(f"{where}: the token must come as a secret")
    state = [mount for mount in _mounts(service) if mount.split(":")[1:2] == [VOLUME]]
    if not state or state[0].split(":")[0] not in (document.get("volumes") or {}):
        problems.append(f"{where}: {VOLUME} must be a named volume")
    if any(environment.get(name) for name in OTLP_ENDPOINTS) and str(environment.get(SDK_OFF)).lower() == "true":
        problems.append(f"{where}: {SDK_OFF} true beside an OTLP endpoint: the supervisor would export nothing")
    return problems
