"""common.ops.logs: JSON and text lines carry the job and iteration set by whoever runs them."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from gradcode.common.ops.cli import add_service_arguments
from gradcode.common.ops.logs import configure_logging, current_iteration, current_job_id, log_context, set_log_context

log = logging.getLogger("gradcode.test")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """A buffer to log into; the root logger's handlers and level are restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buffer = io.StringIO()
    yield buffer
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_job_and_iteration_where_known(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream=stream)
    log.info("outside")
    with log_context(job_id="job-1"):
        log.info("job %s planned", "job-1")
        with log_context(iteration=7):
            log.warning("decoded")
        log.info("after the iteration")
    log.info("outside again")
    records = _records(stream)
    assert [r["message"] for r in records] == [
        "outside", "job job-1 planned", "decoded", "after the iteration", "outside again",
    ]  # fmt: skip
    assert [(r.get("job_id"), r.get("iteration")) for r in records] == [
        (None, None), ("job-1", None), ("job-1", 7), ("job-1", None), (None, None),
    ]  # fmt: skip
    assert records[2]["level"] == "WARNING" and records[2]["logger"] == "gradcode.test"
    assert "context" not in records[0]


async def test_each_task_keeps_its_own_context_and_inherits_its_creators(stream: io.StringIO) -> None:
    configure_logging("INFO", "json", stream=stream)

    async def iteration(t: int) -> None:
        set_log_context(iteration=t)  # this task only
        await asyncio.sleep(0)
        log.info("iteration done")

    with log_context(job_id="job-2"):
        await asyncio.gather(*(asyncio.create_task(iteration(t)) for t in (1, 2, 3)))
        assert current_iteration() is None  # the tasks' values never leak back
    assert current_job_id() is None
    assert sorted((r["job_id"], r["iteration"]) for r in _records(stream)) == [("job-2", 1), ("job-2", 2), ("job-2", 3)]


def test_text_format_names_the_job_and_iteration(stream: io.StringIO) -> None:
    configure_logging("DEBUG", "text", stream=stream)
    with log_context(job_id="job-3", iteration=2):
        log.debug("hello")
    log.debug("plain")
    first, second = stream.getvalue().splitlines()
    assert first.endswith("gradcode.test: [job-3 it 2] hello")
    assert second.endswith("gradcode.test: plain")


def test_unknown_format_is_refused(stream: io.StringIO) -> None:
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("INFO", "yaml")


def test_log_format_and_metrics_port_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("GRADCODE_LOG_FORMAT", "JSON")
    monkeypatch.setenv("GRADCODE_METRICS_PORT", "9464")
    parser = argparse.ArgumentParser()
    add_service_arguments(parser, default_listen="127.0.0.1:0")
    args = parser.parse_args([])
    assert (args.log_format, args.metrics_port) == ("json", 9464)
    assert parser.parse_args(["--log-format", "text", "--metrics-port", "0"]).log_format == "text"
    monkeypatch.setenv("GRADCODE_METRICS_PORT", "lots")
    parser = argparse.ArgumentParser()
    add_service_arguments(parser, default_listen="127.0.0.1:0")
    with pytest.raises(SystemExit):
        parser.parse_args([])


@pytest.mark.parametrize(("variable", "value"), [("GRADCODE_LOG_FORMAT", "xml"), ("GRADCODE_LOG_LEVEL", "LOUD")])
def test_a_bad_logging_setting_from_the_environment_is_a_usage_error(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gradcode.worker.__main__ import parse_arguments

    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exit_:
        parse_arguments([])
    assert exit_.value.code == 2
    assert f"{variable} must be one of" in capsys.readouterr().err
