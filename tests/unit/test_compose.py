"""docker-compose.yml, checked without a Docker engine: every service's command is a real `reliableq`
subcommand with valid arguments, images and ports make sense, health checks gate the start order."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from reliableq.cli.main import build_parser
from reliableq.cli.services import cmd_api, cmd_charge_service, cmd_worker

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
APP_SERVICES = {name: s for name, s in SERVICES.items() if name != "postgres"}
EXPECTED_COMMAND = {"api": cmd_api, "charge-service": cmd_charge_service,
                    "worker-1": cmd_worker, "worker-2": cmd_worker, "worker-3": cmd_worker}


def test_the_services_are_postgres_api_charge_service_and_three_workers():
    """One database, the API, the charge service, three workers."""
    assert set(SERVICES) == {"postgres", *EXPECTED_COMMAND}
    assert SERVICES["postgres"]["image"].startswith("postgres:")


@pytest.mark.parametrize("name", sorted(APP_SERVICES))
def test_each_command_is_a_valid_reliableq_subcommand(name):
    """The CLI's own parser accepts each service's command and picks the expected subcommand."""
    service = APP_SERVICES[name]
    args = build_parser().parse_args(service["command"])
    assert args.run is EXPECTED_COMMAND[name]
    assert service["image"] == "reliableq:local" and service["build"] == "."
    if name.startswith("worker"):
        assert urlparse(args.charge_url).hostname in SERVICES  # reached by service name
        assert args.fleet_limit and args.grace < int(service["stop_grace_period"].rstrip("s"))
    else:
        assert args.host == "0.0.0.0"  # reachable by the other containers


def test_the_api_beyond_loopback_requires_a_token():
    """The CLI refuses a non-loopback API without a token; compose supplies one and fails without it."""
    assert "RELIABLEQ_API_TOKEN" in SERVICES["api"]["environment"]
    assert ":?" in SERVICES["api"]["environment"]["RELIABLEQ_API_TOKEN"]  # compose errors when unset


def test_worker_metrics_beyond_loopback_get_the_token():
    """Each worker serves /metrics to the compose network (where Prometheus would scrape it), so compose
    hands it the API's token, and fails without one, as for the API."""
    for name in ("worker-1", "worker-2", "worker-3"):
        args = build_parser().parse_args(SERVICES[name]["command"])
        assert args.metrics_port and args.metrics_host == "0.0.0.0"
        assert ":?" in SERVICES[name]["environment"]["RELIABLEQ_API_TOKEN"]


def test_published_ports_bind_loopback_and_match_the_commands():
    """Every published port is on 127.0.0.1 and is the port the service listens on."""
    for name, service in SERVICES.items():
        for mapping in service.get("ports", []):
            host_ip, host_port, container_port = mapping.split(":")
            assert host_ip == "127.0.0.1"
            if name in APP_SERVICES:
                assert build_parser().parse_args(service["command"]).port == int(container_port)


def test_health_checks_gate_the_start_order():
    """Servers have health checks; everything that depends on one waits for it to be healthy."""
    for name in ("postgres", "api", "charge-service"):
        assert SERVICES[name]["healthcheck"]["test"]
    for service in APP_SERVICES.values():
        for dependency, condition in service["depends_on"].items():
            assert dependency in SERVICES and "healthcheck" in SERVICES[dependency]
            assert condition == {"condition": "service_healthy"}
        assert "postgres" in service["depends_on"]


def test_databases_are_the_compose_postgres_on_a_named_volume():
    """The services reach PostgreSQL by service name with its credentials; its data is on a named volume."""
    pg = SERVICES["postgres"]["environment"]
    for service in APP_SERVICES.values():
        for key in ("DATABASE_URL", "CHARGE_DATABASE_URL"):
            url = urlparse(service["environment"][key])
            assert (url.hostname, url.port, url.username, url.password) == (
                "postgres", 5432, pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"])
    volume = SERVICES["postgres"]["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


def test_the_image_installs_the_package_with_its_sql():
    """The Dockerfile copies what the wheel needs (the SQL is packaged into it, and the build runs
    pyproject's hook, hatch_build.py) and runs the CLI."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    for needed in ("COPY pyproject.toml", "hatch_build.py", "COPY reliableq", "COPY sql", "COPY stages",
                   "pip install"):
        assert needed in dockerfile
    assert 'ENTRYPOINT ["reliableq"]' in dockerfile
