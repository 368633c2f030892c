"""docker-compose.yml and deploy/ are consistent with the project.

No Docker engine runs here, so these tests check the files themselves: the services
and their start order, that every ``halfcast`` command is a real CLI subcommand, that
every file the stack mounts or copies exists, that Prometheus scrapes the API, and
that the Grafana dashboard queries only metrics the API exports (docs/api.md, "Prometheus series").
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest
import yaml

from halfcast.core.settings import PollReads, Settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

#: Series of docs/api.md, "Prometheus series", that the dashboard may query.
EXPORTED_METRICS = {
    "halfcast_loss_scale",
    "halfcast_skipped_steps_total",
    "halfcast_optimizer_steps_total",
    "halfcast_samples_per_second",
    "halfcast_tokens_per_second",
    "halfcast_train_loss",
    "halfcast_jobs",
    "halfcast_queue_depth",
    "halfcast_worker_up",
    "halfcast_worker_running_jobs",
    "halfcast_http_request_duration_seconds_bucket",
    "halfcast_poll_reads_total",
    "halfcast_poll_change_feed_listening",
}
SERVICES = {"postgres", "redis", "migrate", "api", "worker", "prometheus", "grafana"}
ONE_SHOT = {"migrate", "prometheus-token"}
#: service -> {dependency: condition} that the start order relies on.
REQUIRED_DEPENDENCIES = {
    "migrate": {"postgres": "service_healthy"},
    "api": {"migrate": "service_completed_successfully", "redis": "service_healthy"},
    "worker": {"api": "service_healthy", "redis": "service_healthy"},
}
#: Every halfcast service shares these (one database, one broker, one data volume).
SHARED_ENVIRONMENT = ("HALFCAST_DATABASE_URL", "HALFCAST_BROKER_URL", "HALFCAST_DATA_DIR")


def load_yaml(path: Path) -> dict:
    with path.open() as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return load_yaml(ROOT / "docker-compose.yml")["services"]


def argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def halfcast_services(services: dict[str, dict]) -> dict[str, dict]:
    """The services whose command runs the ``halfcast`` CLI."""
    return {name: s for name, s in services.items() if argv(s.get("command", []))[:1] == ["halfcast"]}


def bind_mounts(service: dict) -> list[tuple[Path, str]]:
    """(host path, container path) of each bind mount (``./...:/...``) of a service."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts.append(((ROOT / source).resolve(), target))
    return mounts


def dependencies(service: dict) -> dict[str, str]:
    """``depends_on`` as {service: condition} (the short list form means service_started)."""
    depends_on = service.get("depends_on", {})
    if isinstance(depends_on, list):
        return dict.fromkeys(depends_on, "service_started")
    return {name: spec.get("condition", "service_started") for name, spec in depends_on.items()}


def test_services_exist(services: dict[str, dict]) -> None:
    assert services.keys() >= SERVICES, f"missing services: {SERVICES - services.keys()}"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", f"{name} is one-shot and must not restart"
        else:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_dependencies(services: dict[str, dict]) -> None:
    for name, required in REQUIRED_DEPENDENCIES.items():
        got = dependencies(services[name])
        for dependency, condition in required.items():
            assert got.get(dependency) == condition, f"{name} must depend on {dependency}: {condition}"
    for name, service in services.items():
        for dependency, condition in dependencies(service).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency} to be healthy"
            if condition == "service_completed_successfully":
                assert dependency in ONE_SHOT, f"{name} waits for {dependency} to exit, which never happens"


def test_halfcast_commands_are_cli_subcommands(services: dict[str, dict]) -> None:
    from halfcast.cli import build_parser

    commands = {name: argv(s["command"]) for name, s in halfcast_services(services).items()}
    assert {"migrate", "api", "worker"} <= commands.keys()
    for name, command in commands.items():
        try:
            build_parser().parse_args(command[1:])
        except SystemExit as exc:  # argparse exits on an unknown command
            pytest.fail(f"service {name}: `{shlex.join(command)}` is not a halfcast command (exit {exc.code})")


def test_halfcast_services_share_database_broker_and_data(services: dict[str, dict]) -> None:
    runs = halfcast_services(services)
    for key in SHARED_ENVIRONMENT:
        values = {name: s.get("environment", {}).get(key) for name, s in runs.items()}
        assert None not in values.values() and len(set(values.values())) == 1, f"{key} differs: {values}"
    database = runs["api"]["environment"]["HALFCAST_DATABASE_URL"]
    assert database.startswith("postgresql+psycopg://") and "@postgres:" in database
    assert runs["api"]["environment"]["HALFCAST_BROKER_URL"].startswith("redis://redis:")
    data_dir = runs["api"]["environment"]["HALFCAST_DATA_DIR"]
    for name, service in runs.items():
        targets = [volume.split(":")[1] for volume in service.get("volumes", []) if not volume.startswith(".")]
        assert data_dir in targets, f"{name} does not mount a volume at {data_dir}"
    # The API must listen beyond the container's loopback for Prometheus and the port mapping.
    assert runs["api"]["environment"].get("HALFCAST_HOST") == "0.0.0.0"


def test_built_and_mounted_files_exist(services: dict[str, dict]) -> None:
    dockerfile = ROOT / "Dockerfile"
    assert dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in [word for word in line.split()[1:-1] if not word.startswith("--")]:
                assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            context = build if isinstance(build, str) else build.get("context", ".")
            assert (ROOT / context).resolve() == ROOT, f"{name} builds from {context}, not the repository"
        for host, _ in bind_mounts(service):
            assert host.exists(), f"{name} mounts missing {host}"
    gpu = load_yaml(DEPLOY / "compose.gpu.yml")["services"]
    assert gpu.keys() <= services.keys()


def test_prometheus_scrapes_the_api(services: dict[str, dict]) -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    api_port = services["api"]["ports"][0].split(":")[-1]
    scraping = [
        job
        for job in config["scrape_configs"]
        if job.get("metrics_path", "/metrics") == "/metrics"
        and f"api:{api_port}" in [t for group in job["static_configs"] for t in group["targets"]]
    ]
    assert scraping, f"no scrape config for api:{api_port}/metrics"
    interval = scraping[0].get("scrape_interval", config.get("global", {}).get("scrape_interval"))
    assert interval == "5s"
    # /metrics needs an admin token: the file the prometheus-token service writes, mounted into Prometheus
    token_file = PurePosixPath(scraping[0]["authorization"]["credentials_file"])
    writer = argv(services["prometheus-token"]["command"])
    assert writer[writer.index("--file") + 1] == str(token_file) and "--admin" in writer
    for name in ("prometheus", "prometheus-token"):
        targets = [
            PurePosixPath(v.split(":")[1]) for v in services[name]["volumes"] if v.startswith("halfcast-secrets:")
        ]
        assert targets and token_file.is_relative_to(targets[0]), f"{name} does not mount the token's volume"


def grafana_dashboards(services: dict[str, dict]) -> list[Path]:
    """Dashboard JSON files on the host, found through the provisioned providers' paths."""
    mounts = bind_mounts(services["grafana"])
    files = []
    for provider_file in (DEPLOY / "grafana" / "provisioning" / "dashboards").glob("*.y*ml"):
        for provider in load_yaml(provider_file)["providers"]:
            target = PurePosixPath(provider["options"]["path"])
            hosts = [host / target.relative_to(t) for host, t in mounts if target.is_relative_to(t)]
            assert hosts, f"{provider_file.name}: {target} is not mounted into grafana"
            files += sorted(hosts[0].glob("*.json"))
    return files


def test_grafana_datasource_is_prometheus() -> None:
    folder = DEPLOY / "grafana" / "provisioning" / "datasources"
    sources = [s for f in folder.glob("*.y*ml") for s in load_yaml(f)["datasources"]]
    assert any(s["type"] == "prometheus" and s["url"] == "http://prometheus:9090" for s in sources)


def test_grafana_panels_query_exported_metrics(services: dict[str, dict]) -> None:
    dashboards = grafana_dashboards(services)
    assert dashboards, "no dashboard JSON is provisioned"
    queried = set()
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        templating = dashboard.get("templating", {}).get("list", [])
        variables = [v["definition"] for v in templating if v["type"] == "query"]
        expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        for expr in expressions + variables:
            names = set(re.findall(r"\bhalfcast_\w+", expr))
            assert names, f"{path.name}: {expr!r} queries no halfcast metric"
            assert names <= EXPORTED_METRICS, f"{path.name}: {expr!r} queries unknown {names - EXPORTED_METRICS}"
            queried |= names
    assert queried == EXPORTED_METRICS, f"never charted: {EXPORTED_METRICS - queried}"


def test_a_dead_worker_is_started_again_by_compose_and_by_the_systemd_unit(services: dict[str, dict]) -> None:
    """Issue 11: whatever kills a worker must not leave the host without one (docs/worker.md)."""
    assert services["worker"]["restart"] in ("always", "unless-stopped")
    unit = (DEPLOY / "systemd" / "halfcast-worker.service").read_text()
    settings = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["Restart"] == "always" and argv(settings["ExecStart"])[-1] == "worker"
    assert {name for name in SHARED_ENVIRONMENT if f"Environment={name}=" in unit} == set(SHARED_ENVIRONMENT)


def test_two_worker_hosts_share_database_broker_and_runs_directory(services: dict[str, dict]) -> None:
    """Issue 16: a multi-node job needs workers on several hosts with the same database, broker and runs."""
    workers = {name: s for name, s in halfcast_services(services).items() if argv(s["command"])[-1] == "worker"}
    assert len(workers) >= 2, f"one worker service only: {sorted(workers)}"
    for key in SHARED_ENVIRONMENT:
        assert len({s["environment"].get(key) for s in workers.values()}) == 1, key
    assert len({tuple(s.get("volumes", [])) for s in workers.values()}) == 1


def test_the_halfcast_services_environment_is_valid_settings(
    services: dict[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ``HALFCAST_*`` value compose sets loads (a misspelt choice would stop the container at start)."""
    for name, service in halfcast_services(services).items():
        for key, value in service.get("environment", {}).items():
            monkeypatch.setenv(key, str(value))
        settings = Settings()
        assert settings.poll_reads is PollReads.NOTIFIED, name  # the compose deployment runs on PostgreSQL
