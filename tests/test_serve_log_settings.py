"""Triton's logging extension: the log settings of the ``hybrid`` logger read and changed over HTTP and gRPC
through unmodified tritonclient; switches that are not one severity threshold, unknown keys, bad values and a
new log file refused. The differential test against the real Triton is in test_serve_vs_triton.py."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests._serve_support import serving, tiny_repo

from hybrid.errors import ServingError
from hybrid.serve.triton.log_settings import LogSettings

tg = pytest.importorskip("tritonclient.grpc")
import tritonclient.http as th  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def logger():
    """A logger of its own, with one handler, so the tests leave the ``hybrid`` logger alone."""
    log = logging.getLogger("hybrid.test_log_settings")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield log
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)


def test_the_settings_are_read_from_the_logger_s_level(logger):
    settings = LogSettings(logger)
    assert settings.current() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                  "log_verbose_level": 0, "log_format": "default"}
    logger.setLevel(logging.ERROR)
    assert settings.current()["log_warning"] is False and settings.current()["log_error"] is True


@pytest.mark.parametrize(("changes", "level"), [
    ({"log_info": False}, logging.WARNING),
    ({"log_info": False, "log_warning": False}, logging.ERROR),
    ({"log_info": False, "log_warning": False, "log_error": False}, logging.CRITICAL + 10),
    ({"log_verbose_level": 2}, logging.DEBUG),
    ({}, logging.INFO),
])
def test_an_update_sets_the_threshold_the_switches_describe(logger, changes, level):
    after = LogSettings(logger).update(changes)
    assert logger.level == level
    assert {k: after[k] for k in changes} == changes


@pytest.mark.parametrize(("changes", "says"), [
    ({"log_warning": False}, "severity"),  # info on, warnings off: no threshold
    ({"log_info": False, "log_verbose_level": 1}, "severity"),
    ({"log_info": "yes"}, "true or false"),
    ({"log_verbose_level": -1}, "an integer in 0.."),
    ({"log_verbose_level": True}, "an integer in 0.."),
    ({"log_verbose_level": 1 << 32}, "uint32"),
    ({"log_format": "xml"}, "ISO8601"),
    ({"log_file": "/tmp/x.log"}, "cannot be changed over the network"),
    ({"nope": 1}, "unknown log setting"),
])
def test_bad_updates_are_refused_and_change_nothing(logger, changes, says):
    settings = LogSettings(logger)
    before = settings.current()
    with pytest.raises(ServingError) as info:
        settings.update(changes)
    assert info.value.code == "HYB-702" and says in info.value.message
    assert settings.current() == before and logger.level == logging.INFO


def test_iso8601_puts_the_utc_time_before_each_line_and_default_takes_it_away(logger):
    settings = LogSettings(logger)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None, created=0.25)
    record.created, record.msecs = 0.25, 250.0
    settings.update({"log_format": "ISO8601"})
    assert logger.handlers[-1].format(record) == "1970-01-01T00:00:00.250000Z INFO hello"
    settings.update({"log_format": "default"})
    assert logger.handlers[-1].format(record) == "INFO hello"


@pytest.fixture
def server(tmp_path):
    level = logging.getLogger("hybrid").level  # the in-process server's settings are this process's logger
    try:
        with serving([tiny_repo(tmp_path)]) as srv:
            yield srv
    finally:
        logging.getLogger("hybrid").setLevel(level)


def test_clients_read_and_change_the_settings_over_http_and_grpc(server):
    logging.getLogger("hybrid").setLevel(logging.INFO)
    http = th.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = tg.InferenceServerClient(server.grpc_url)
    try:
        assert "logging" in http.get_server_metadata()["extensions"]
        assert http.get_log_settings()["log_info"] is True
        assert http.update_log_settings({"log_info": False})["log_info"] is False
        assert logging.getLogger("hybrid").level == logging.WARNING
        answer = grpc.update_log_settings({"log_verbose_level": 1, "log_info": True}, as_json=True)["settings"]
        assert answer["log_verbose_level"] == {"uint32_param": 1} and answer["log_info"] == {"bool_param": True}
        assert logging.getLogger("hybrid").level == logging.DEBUG
        assert grpc.get_log_settings(as_json=True)["settings"]["log_format"] == {"string_param": "default"}
        with pytest.raises(InferenceServerException) as info:
            http.update_log_settings({"log_file": "/tmp/elsewhere.log"})
        assert info.value.status() == "400" and "HYB-702" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            grpc.update_log_settings({"log_warning": False})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        grpc.close()
        http.close()


def test_a_server_without_log_settings_says_so_and_refuses_them(tmp_path):
    """A call to a deployment on Ray reaches one replica of several: ServeOptions(log_settings=False)."""
    with serving([tiny_repo(tmp_path)], log_settings=False) as srv:
        client = th.InferenceServerClient(srv.url.removeprefix("http://"))
        assert "logging" not in client.get_server_metadata()["extensions"]
        with pytest.raises(InferenceServerException) as info:
            client.update_log_settings({"log_info": True})
        assert info.value.status() == "400" and "replicas" in info.value.message()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["log_file", "log_info", "log_warning", "log_error", "log_verbose_level",
                                        "log_format", "other"]),
                       st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=8),
                       max_size=6))
def test_arbitrary_updates_only_ever_raise_hyb_702(changes):
    log = logging.getLogger("hybrid.test_log_settings.arbitrary")
    try:
        LogSettings(log).update(changes)
    except ServingError as e:
        assert e.code == "HYB-702"
    finally:
        log.setLevel(logging.NOTSET)
