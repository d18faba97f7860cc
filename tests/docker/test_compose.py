"""docker/: the compose file, the image, Prometheus and Grafana provisioning, checked by parsing them.

No Docker engine runs here, so the files are read as data: the compose file must name every
service of the cluster with healthchecks, start-up conditions and volumes; every PromQL
expression of the dashboard and the alert rules must name only metrics the code exports; and
promtool (Debian's ``prometheus`` package, installed by ``make test``) must accept the
Prometheus config, the alert rules and every dashboard expression.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django_prometheus.middleware import Metrics
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import Metric

from scheduler.metrics import register_cluster_state
from tests.support.metrics import ISSUE_METRICS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "stint.json"
PROMETHEUS = DOCKER / "prometheus" / "prometheus.yml"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
METRICS_PORT = "9100"  # --metrics-port of every non-web process in the compose file

STINT_PROCESSES = ("web", "scheduler", "worker", "worker-processes", "audit-consumer")
SERVICES = ("postgres", "redis", "kafka", "migrate", *STINT_PROCESSES, "prometheus", "grafana")
# Series Prometheus itself adds to every target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
SECRET_NAMES = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$|DATABASE_URL")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def command_of(service: dict) -> list[str]:
    command = service.get("command", [])
    return command.split() if isinstance(command, str) else command


# -- the compose file --------------------------------------------------------------------------


def test_the_compose_file_names_every_service_of_the_cluster(services: dict) -> None:
    assert set(SERVICES) <= set(services)
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana")
    assert not any("zookeeper" in name for name in services)


def test_kafka_runs_in_kraft_mode(services: dict) -> None:
    env = services["kafka"]["environment"]

    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert "CONTROLLER" in env["KAFKA_CONTROLLER_LISTENER_NAMES"]


def test_stint_processes_share_one_image_and_run_the_right_commands(services: dict) -> None:
    images = {services[name]["image"] for name in (*STINT_PROCESSES, "migrate")}
    assert len(images) == 1
    assert command_of(services["web"])[0] == "gunicorn"
    assert command_of(services["scheduler"])[2] == "run_scheduler"
    assert services["scheduler"]["deploy"]["replicas"] == 3
    pools = {name: command_of(services[name]) for name in ("worker", "worker-processes")}
    assert all(cmd[2] == "run_workers" for cmd in pools.values())
    assert pools["worker"][pools["worker"].index("--pool") + 1] == "threads"
    assert pools["worker-processes"][pools["worker-processes"].index("--pool") + 1] == "processes"
    assert command_of(services["audit-consumer"])[2] == "run_audit_consumer"
    migrate = " ".join(command_of(services["migrate"]))
    # A docker/.env still holding a placeholder secret stops the cluster before anything is created.
    assert migrate.index("manage.py check --deploy &&") < migrate.index("manage.py migrate")
    for name in ("scheduler", "worker", "worker-processes", "audit-consumer"):
        command = command_of(services[name])
        assert command[command.index("--metrics-port") + 1] == METRICS_PORT, name
    everything = COMPOSE.read_text() + (DOCKER / "Dockerfile").read_text()
    assert "runserver" not in everything


def test_scalable_services_have_no_fixed_container_name_or_host_port(services: dict) -> None:
    for name in ("scheduler", "worker", "worker-processes", "audit-consumer"):
        assert "container_name" not in services[name]
        assert "ports" not in services[name]


def test_every_long_running_service_has_a_healthcheck(services: dict) -> None:
    for name in SERVICES:
        check = services[name].get("healthcheck", {})
        if name == "migrate":
            assert check.get("disable") is True  # a one-shot job
            continue
        assert check.get("test"), name
        assert check.get("interval"), name


def test_start_up_waits_on_health_and_on_the_one_shot_migration(services: dict) -> None:
    assert services["migrate"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "kafka": {"condition": "service_healthy"},  # create_topics provisions the event topic
    }
    assert "manage.py create_topics" in services["migrate"]["command"][-1]
    assert services["migrate"]["restart"] == "no"
    for name in STINT_PROCESSES:
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        for backend in ("postgres", "redis", "kafka"):
            assert depends[backend] == {"condition": "service_healthy"}, (name, backend)
    assert services["prometheus"]["depends_on"]["web"] == {"condition": "service_healthy"}
    assert services["grafana"]["depends_on"]["prometheus"] == {"condition": "service_healthy"}


def seconds(text: str) -> float:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", text)
    assert match and text, text
    return int(match[1] or 0) * 60 + float(match[2] or 0)


def test_stop_grace_outlasts_the_workers_shutdown_grace(services: dict) -> None:
    grace = settings.SCHEDULER["SHUTDOWN_GRACE_SECONDS"]

    for name in STINT_PROCESSES:
        assert seconds(services[name]["stop_grace_period"]) > grace, name


def test_data_lives_in_named_volumes(compose: dict, services: dict) -> None:
    mounts = {
        "postgres": "/var/lib/postgresql/data",
        "redis": "/data",
        "kafka": "/var/lib/kafka/data",
        "prometheus": "/prometheus",
        "grafana": "/var/lib/grafana",
    }
    for name, target in mounts.items():
        volume = next(v.split(":")[0] for v in services[name]["volumes"] if v.split(":")[1] == target)
        assert volume in compose["volumes"], name


def test_secrets_come_only_from_the_env_file(services: dict) -> None:
    for name in (*STINT_PROCESSES, "migrate", "postgres", "prometheus", "grafana"):
        assert services[name]["env_file"] == ".env", name
    for name, service in services.items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), name
        leaked = [key for key in environment if SECRET_NAMES.search(key)]
        assert not leaked, (name, leaked)
    example = (DOCKER / ".env.example").read_text()
    for key in ("POSTGRES_PASSWORD", "DATABASE_URL", "SECRET_KEY", "JWT_SIGNING_KEY", "METRICS_BEARER_TOKEN"):
        assert re.search(rf"^{key}=", example, re.M), key
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, "docker/.env must be git-ignored"


def test_the_image_is_slim_unprivileged_and_runs_gunicorn() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in dockerfile.splitlines() if line and not line.startswith("#")]
    keywords = [parts[0] for parts in instructions if parts[0].isupper()]

    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    users = [parts[1].strip() for parts in instructions if parts[0] == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    assert keywords.index("USER") > keywords.index("COPY")  # nothing runs as root after the code lands
    assert json.loads(dockerfile.split("\nCMD ", 1)[1].splitlines()[0])[0] == "gunicorn"
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".env", ".venv", ".devstack", ".git"} <= set(ignore)


def test_the_gunicorn_config_loads_the_application() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--check-config", "--config", "docker/gunicorn.conf.py", "config.wsgi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_scrapes_every_stint_service_on_its_port(services: dict) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    assert jobs["stint-web"]["static_configs"][0]["targets"] == ["web:8000"]
    assert jobs["stint-web"]["authorization"]["credentials_file"] == "metrics-token"
    discovered = {}
    for name in ("stint-scheduler", "stint-worker", "stint-audit"):
        for sd in jobs[name]["dns_sd_configs"]:
            assert str(sd["port"]) == METRICS_PORT
            discovered.update(dict.fromkeys(sd["names"], name))
    assert discovered == {
        "scheduler": "stint-scheduler",
        "worker": "stint-worker",
        "worker-processes": "stint-worker",
        "audit-consumer": "stint-audit",
    }
    assert config["rule_files"] == ["alerts.yml"]
    mounts = " ".join(services["prometheus"]["volumes"])
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml" in mounts
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml" in mounts
    assert "/etc/prometheus/metrics-token" in " ".join(services["prometheus"]["entrypoint"])


def test_grafana_provisions_the_datasource_and_the_dashboard(services: dict) -> None:
    provisioning = DOCKER / "grafana" / "provisioning"
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "stint.yaml").read_text())["providers"]
    dashboard = json.loads(DASHBOARD.read_text())

    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in services["grafana"]["volumes"] if v.startswith("./"))
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    uids = {p["datasource"]["uid"] for p in panels(dashboard)} | {
        t["datasource"]["uid"] for p in panels(dashboard) for t in p["targets"]
    }
    assert uids == {datasource["uid"]}


# -- PromQL names only exported metrics ----------------------------------------------------------


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def dashboard_expressions() -> list[str]:
    return [t["expr"] for p in panels(json.loads(DASHBOARD.read_text())) for t in p["targets"]]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
PROMQL_WORDS = {
    # aggregation operators (may be followed by by/without before their parenthesis)
    *"sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio".split(),
    # keywords and literals
    *"by without on ignoring group_left group_right and or unless bool offset atan2 inf nan".split(),
}


def metric_names(expr: str) -> set[str]:
    """Return the metric names a PromQL expression selects (functions, labels, durations excluded)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges and subqueries
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w:.$])([A-Za-z_:][\w:]*)", expr):
        word = match[1]
        if word in PROMQL_WORDS or expr[match.end() :].lstrip().startswith("("):
            continue  # an operator, or a function call
        names.add(word)
    return names


def sample_names(families: Iterator[Metric]) -> set[str]:
    """Every series name a scrape of these families can contain."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("_sum", "_count", "_created", ""),
        "info": ("_info",),
    }
    return {family.name + suffix for family in families for suffix in suffixes.get(family.type, ("",))}


def exported_names() -> set[str]:
    """Series names of every process: scheduler.metrics, the cluster collector and django-prometheus."""
    Metrics.get_instance()  # django-prometheus registers its django_http_* families on first use
    cluster = CollectorRegistry()
    register_cluster_state(cluster)
    return sample_names(REGISTRY.collect()) | sample_names(cluster.collect())


def test_the_promql_name_extractor_handles_the_shapes_we_use() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, type) (rate(jobs_execution_duration_seconds_bucket{queue=~"$queue"}'
        "[$__rate_interval]))) / on(instance) group_left max without (job) (up offset 5m) "
        "or vector(0) > bool 1e-3"
    )

    assert metric_names(expr) == {"jobs_execution_duration_seconds_bucket", "up"}


@pytest.mark.parametrize(
    ("source", "expressions"), [("dashboard", dashboard_expressions), ("alerts", alert_expressions)]
)
def test_every_promql_expression_names_only_exported_metrics(source: str, expressions) -> None:
    exported = exported_names() | PROMETHEUS_SYNTHETIC
    exprs = expressions()
    assert exprs

    unknown = {(expr, name) for expr in exprs for name in metric_names(expr) if name not in exported}

    assert not unknown, f"{source} names metrics no process exports: {sorted(unknown)}"
    assert all(metric_names(expr) for expr in exprs)


def test_the_dashboard_has_a_panel_for_every_metric_family_of_the_issue() -> None:
    used = {name for expr in dashboard_expressions() for name in metric_names(expr)}
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}

    missing = [name for name in ISSUE_METRICS if name not in families]

    assert not missing
    assert any(name.startswith("django_http_") for name in used)


def test_the_alert_rules_cover_the_issue() -> None:
    rules = {rule["alert"]: rule["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for rule in g["rules"]}
    by_metric = {name: alert for alert, expr in rules.items() for name in metric_names(expr)}

    assert by_metric["jobs_queue_depth"] == "StintQueueDepthGrowing"
    assert by_metric["jobs_dead_total"] == "StintDeadJobs"
    assert by_metric["outbox_backlog"] == "StintOutboxBacklog"
    assert "StintNoSchedulerLeader" in rules and "scheduler_is_leader" in metric_names(rules["StintNoSchedulerLeader"])
    assert by_metric["workers_heartbeat_overdue"] == "StintWorkerMissingHeartbeats"
    assert by_metric["audit_messages_quarantined_total"] == "StintAuditMessagesQuarantined"
    assert by_metric["audit_events_repaired_total"] == "StintAuditEventsRepaired"
    assert by_metric["audit_offset_gaps_total"] == "StintAuditOffsetGaps"
    assert by_metric["worker_processes_died_total"] == "StintWorkerProcessesCrashing"
    assert by_metric["worker_outcomes_unrecorded_total"] == "StintOutcomesUnrecorded"
    assert by_metric["worker_claim_duration_seconds_bucket"] == "StintClaimsSlow"


# -- promtool ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool was not found, so the Prometheus config and rules were NOT checked. It comes with "
            "Debian's prometheus package: `make test` installs it when run as root with apt-get "
            "(`apt-get install prometheus`)."
        )
    return path


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_cluster_config_and_alert_rules(promtool: str, tmp_path: Path) -> None:
    # The config reads the bearer token from metrics-token beside it (written at container start).
    shutil.copy(PROMETHEUS, tmp_path / "prometheus.yml")
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    (tmp_path / "metrics-token").write_text("x" * 40)

    config = run([promtool, "check", "config", str(tmp_path / "prometheus.yml")])
    rules = run([promtool, "check", "rules", str(ALERTS)])

    assert config.returncode == 0, config.stdout + config.stderr
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"SUCCESS: {len(alert_expressions())} rules found" in rules.stdout


def test_promtool_parses_every_dashboard_expression(promtool: str, tmp_path: Path) -> None:
    exprs = dashboard_expressions()
    recording = []
    for i, expr in enumerate(exprs):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        recording.append({"record": f"dashboard:panel_{i}", "expr": expr.replace("$queue", ".*")})
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))

    result = run([promtool, "check", "rules", str(rules)])

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_make_observe_writes_a_config_promtool_accepts(promtool: str, tmp_path: Path) -> None:
    made = run(["make", "--no-print-directory", "-s", "observe-config", f"OBSERVE_DIR={tmp_path}", "PORT=8123"])
    assert made.returncode == 0, made.stdout + made.stderr
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())

    checked = run([promtool, "check", "config", str(tmp_path / "prometheus.yml")])

    assert checked.returncode == 0, checked.stdout + checked.stderr
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    procfile = (ROOT / "Procfile").read_text()
    assert targets == {
        "stint-web": ["127.0.0.1:8123"],
        # make run's metrics ports for PORT=8123: PORT + 1101 to 1103 (it says so when it picks others)
        "stint-scheduler": ["127.0.0.1:9224"],
        "stint-worker": ["127.0.0.1:9225"],
        "stint-audit": ["127.0.0.1:9226"],
    }
    for command, variable, port in (
        ("run_scheduler", "STINT_SCHEDULER_METRICS_PORT", 9101),
        ("run_workers", "STINT_WORKERS_METRICS_PORT", 9102),
        ("run_audit_consumer", "STINT_AUDIT_METRICS_PORT", 9103),
    ):
        assert re.search(rf"manage\.py {command} .*--metrics-port \$\{{{variable}:-{port}\}}", procfile), command
    assert config["rule_files"] == [str(ALERTS)]


# Logs its arguments beside itself; "install" writes do-nothing prometheus and promtool there.
FAKE_APT_GET = r"""#!/bin/sh
echo "apt-get $*" >> "${0%/*}/apt.log"
case "$*" in *install*)
  for tool in prometheus promtool; do printf '#!/bin/sh\n' > "${0%/*}/$tool"; chmod +x "${0%/*}/$tool"; done;;
esac
"""


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("observe", "make observe runs a local Prometheus server"),
        ("prometheus-tools", "make test checks docker/prometheus/ with promtool"),
    ],
)
def test_a_missing_prometheus_is_installed_only_after_saying_what_why_and_how_to_undo(
    tmp_path: Path, target: str, why: str
) -> None:
    # make observe used to apt-install Debian's prometheus package with its output hidden and no word of why.
    bin_dir = tmp_path / "bin"  # a PATH without prometheus: the tools make needs, root's id and a fake apt-get
    bin_dir.mkdir()
    for tool in ("sed", "mkdir", "expr", "chmod"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for tool, script in (("apt-get", FAKE_APT_GET), ("id", "#!/bin/sh\necho 0\n")):
        (bin_dir / tool).write_text(script)
        (bin_dir / tool).chmod(0o755)

    made = subprocess.run(
        [shutil.which("make"), "--no-print-directory", "-s", target, f"OBSERVE_DIR={tmp_path / 'observe'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        check=False,
    )

    assert made.returncode == 0, made.stdout + made.stderr
    said = made.stdout.split("Installed:")[0]
    assert f"prometheus/promtool not found; {why}" in said
    assert "Debian's prometheus package" in said and "apt-get install --no-install-recommends prometheus" in said
    assert "To undo: apt-get remove prometheus." in said
    assert (
        (bin_dir / "apt.log").read_text().splitlines()[-1].endswith("install -y -qq --no-install-recommends prometheus")
    )


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_make_runs_observe_hint_carries_an_observe_port_that_was_set(how: str) -> None:
    # `make run` prints the `make observe ...` line to paste; it dropped OBSERVE_PORT, so the pasted
    # line started Prometheus on 9090 instead of the port the user had chosen.
    args = ["make", "--no-print-directory", "-n", "serve"]
    env = {**os.environ, "OBSERVE_PORT": "9311"} if how == "environment" else None
    made = subprocess.run(
        [*args, "OBSERVE_PORT=9311"] if how == "argument" else args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert "make observe PORT=8000 OBSERVE_PORT=9311 SCHEDULER_METRICS_PORT=" in made.stdout
    unset = subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "OBSERVE_PORT"},
    )
    assert "OBSERVE_PORT" not in unset.stdout  # the default (9090) needs no mention
