"""`/metrics` of the real server is strict Prometheus text (format 0.0.4): every family it
exposes has `# HELP` and `# TYPE`, which `promtool check metrics` and some scrapers require.
The exposition is parsed strictly here; where Debian's `promtool` is installed it checks it
too."""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.integration

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
KINDS = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(text: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise AssertionError(f"value {text!r}")
    return float(text)


def parse_labels(text: str) -> tuple[dict[str, str], str]:
    """`{k="v",...} rest` -> (labels, rest); no labels -> ({}, text)."""
    if not text.startswith("{"):
        return {}, text
    labels: dict[str, str] = {}
    pos = 1
    while text[pos] != "}":
        m = LABEL.match(text, pos)
        assert m, f"bad label at {text[pos:]!r}"
        assert m.group(1) not in labels, f"label twice: {text}"
        labels[m.group(1)] = m.group(2)
        pos = m.end()
        if text[pos] == ",":
            pos += 1
    return labels, text[pos + 1 :]


def check_exposition(text: str) -> dict[str, str]:
    """Every family: one `# HELP`, then one `# TYPE`, then its samples, together; no series
    twice; histogram buckets rise to `+Inf`, which equals `_count`. Returns {family: type}."""
    families: dict[str, str] = {}
    current: str | None = None
    help_for: str | None = None
    series: set[str] = set()
    buckets: dict[str, list[float]] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert NAME.fullmatch(name) and help_text.strip(), line
            assert name not in families and help_for is None, f"HELP again: {line}"
            help_for = name
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert help_for == name, f"no HELP before {line}"
            assert kind in KINDS, line
            families[name], current, help_for = kind, name, None
            continue
        assert not line.startswith("#"), f"stray comment: {line}"
        assert current is not None and help_for is None, f"sample outside a family: {line}"
        name = NAME.match(line)
        assert name, line
        labels, rest = parse_labels(line[name.end() :])
        assert rest.startswith(" "), line
        value = parse_value(rest[1:].split(" ")[0])
        suffixes = ("_bucket", "_sum", "_count") if families[current] == "histogram" else ("",)
        assert name.group() in {current + s for s in suffixes}, f"{line} in {current}"
        key = name.group() + repr(sorted(labels.items()))
        assert key not in series, f"twice: {line}"
        series.add(key)
        base = repr(sorted((k, v) for k, v in labels.items() if k != "le"))
        if name.group() == current + "_bucket":
            rising = buckets.setdefault(current + base, [])
            assert not rising or value >= rising[-1], f"buckets must not decrease: {line}"
            rising.append(value)
            if labels["le"] == "+Inf":
                counts.setdefault(current + base, value)
        elif name.group() == current + "_count":
            assert counts.get(current + base) == value, f"+Inf bucket != count: {line}"
        elif families[current] == "counter":
            assert value >= 0 and not math.isnan(value), line
    assert help_for is None, "HELP without TYPE at the end"
    return families


def test_checker_refuses_what_promtool_refuses():
    assert check_exposition('# HELP a A.\n# TYPE a counter\na{x="1"} 2\n') == {"a": "counter"}
    for bad in [
        "# TYPE a counter\na 1\n",  # no HELP
        "# HELP a A.\na 1\n",  # no TYPE
        "# HELP a A.\n# TYPE a counter\nb 1\n",  # a sample of no family
        "# HELP a A.\n# TYPE a counter\na{x=1} 1\n",  # unquoted label value
        "# HELP a A.\n# TYPE a counter\na 1\na 2\n",  # a series twice
        '# HELP a A.\n# TYPE a histogram\na_bucket{le="+Inf"} 2\na_count 1\n',
    ]:
        with pytest.raises((AssertionError, IndexError, KeyError)):
            check_exposition(bad)


def test_every_family_the_server_exposes_has_help_and_type(start_server, minilm_dir):
    server = start_server(minilm_dir, "--max-client-batch-size", "4")
    # Answers of every kind, so that the families a working server exposes are there.
    assert server.post("/embed", {"inputs": ["hello", "world"]}).status_code == 200
    assert server.post("/v1/embeddings", {"input": "hello"}).status_code == 200
    assert server.post("/vertex", {"instances": [{"inputs": "a"}]}).status_code == 200
    assert server.post("/embed", {"inputs": ""}).status_code == 400
    assert server.post("/embed", {"inputs": ["a"] * 5}).status_code == 422
    assert server.get("/embed").status_code == 405
    assert server.get("/nowhere").status_code == 404
    r = server.get("/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = check_exposition(r.text)
    for family in (
        "te_request_count",
        "te_request_success",
        "te_request_failure",
        "te_request_duration",
        "te_queue_size",
        "te_batch_next_size",
        "te_batch_inference_success",
        "te_connection_open",
    ):
        assert family in families, r.text
    promtool = shutil.which("promtool")
    if promtool:
        check = subprocess.run(
            [promtool, "check", "metrics"], input=r.text, capture_output=True, text=True
        )
        # promtool also lints names (e.g. a counter without `_total`); TEI's names are kept,
        # so only its format errors and missing help fail the test.
        problems = [
            line
            for line in (check.stdout + check.stderr).splitlines()
            if "no help text" in line or "error" in line.lower()
        ]
        assert not problems, check.stdout + check.stderr
