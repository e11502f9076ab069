"""What Debian's redis_exporter does with a -script, as the docs say it
does; if a later version behaves otherwise, these fail first."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from promstack import EXPORTER_BIN, Exporter, Server, raw_info


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server("redis-7.0", tmp_path / "redis", module=True).start()
    yield s
    s.stop()


def metric(text: str, name: str) -> dict[str, float]:
    """The samples of one metric in an exposition, by their label set."""
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(\{{.*\}})? (\S+)", line)
        if m:
            found[m.group(1) or ""] = float(m.group(2))
    return found


def scrape_with(tmp_path: Path, server: Server, script: Path | None) -> str:
    exporter = Exporter(tmp_path / "exporter", server.port, script=script).start()
    try:
        return exporter.scrape()
    finally:
        exporter.stop()


def test_it_sends_info_all_and_exports_no_tb_field_without_the_script(tmp_path: Path, server: Server) -> None:
    with server.client(socket_timeout=10) as c, c.monitor() as monitor:
        c.execute_command("TB.CONSUME", "rl:a", 2, 1)
        text = scrape_with(tmp_path, server, None)
        # What it asked Redis for, as MONITOR saw it (a timeout fails the test).
        seen: list[str] = []
        while not any(cmd.upper().startswith("INFO") for cmd in seen):
            seen.append(monitor.next_command()["command"])
        assert seen[-1].upper() == "INFO ALL"
        assert "# tb" not in raw_info(c, "all") and "# tb" not in raw_info(c, "default")
        assert "# tb" in raw_info(c, "everything") and "# tb" in raw_info(c, "modules")
    assert metric(text, "redis_up") == {"": 1}
    assert "tb_" not in text
    assert metric(text, "redis_commands_total")['{cmd="tb.consume"}'] == 1


def test_a_failing_script_makes_redis_up_0(tmp_path: Path, server: Server) -> None:
    bad = tmp_path / "bad.lua"
    bad.write_text("return redis.call('NOSUCHCOMMAND')")
    text = scrape_with(tmp_path, server, bad)
    assert metric(text, "redis_up") == {"": 0}
    errors = metric(text, "redis_exporter_last_scrape_error")
    assert list(errors.values()) == [1] and "Unknown Redis command" in next(iter(errors))


def test_a_value_that_is_not_a_number_makes_redis_up_0(tmp_path: Path, server: Server) -> None:
    # As the module's tb_version would, were the script to pass it on.
    bad = tmp_path / "version.lua"
    bad.write_text("return {'tb_admitted', '1', 'tb_version', '0.1.0'}")
    text = scrape_with(tmp_path, server, bad)
    assert metric(text, "redis_up") == {"": 0}
    assert "ParseFloat" in next(iter(metric(text, "redis_exporter_last_scrape_error")))


def test_the_collect_script_is_cached_once_however_many_scrapes(tmp_path: Path, server: Server) -> None:
    exporter = Exporter(tmp_path / "exporter", server.port).start()
    try:
        for _ in range(5):
            assert metric(exporter.scrape(), "redis_up") == {"": 1}
    finally:
        exporter.stop()
    with server.client() as c:
        assert c.info("memory")["number_of_cached_scripts"] == 1
        assert c.info("commandstats")["cmdstat_eval"]["calls"] == 5


def test_it_takes_one_script_file_not_a_list(tmp_path: Path) -> None:
    a, b = tmp_path / "a.lua", tmp_path / "b.lua"
    a.write_text("return {}")
    b.write_text("return {}")
    run = subprocess.run([EXPORTER_BIN, "-script", f"{a},{b}", "-web.listen-address", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode != 0
    assert "Error loading script file" in run.stderr
