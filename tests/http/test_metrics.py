"""`/metrics` of the real server is strict Prometheus text (format 0.0.4): every family it
exposes has `# HELP` and `# TYPE`, which `promtool check metrics` and some scrapers require.
The exposition is parsed strictly here; where Debian's `promtool` is installed it checks it
too. With several models served, each model's series carry `model="<name>"`; with one, no
series has that label."""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest
from checkpoints import make_checkpoint

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
    assert 'model="' not in r.text, "one model: its series are unlabelled"
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


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(name, labels): value} of every sample of an exposition."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = NAME.match(line)
            assert name, line
            labels, rest = parse_labels(line[name.end() :])
            found[name.group(), frozenset(labels.items())] = parse_value(rest.split()[0])
    return found


def test_each_models_series_carry_its_name(start_server, tmp_path):  # type: ignore[no-untyped-def]
    embedder = make_checkpoint(tmp_path / "embedder", "BertModel", seed=1)
    reranker = make_checkpoint(
        tmp_path / "reranker", "BertForSequenceClassification", num_labels=1, seed=2
    )
    server = start_server(f"emb={embedder}", "--model-id", f"rr={reranker}")
    texts = ["the cat sat on the mat", "a river runs through paris", "search engine query"]
    assert server.post("/embed", {"inputs": texts[0]}).status_code == 200
    assert server.post("/embed", {"inputs": texts, "model": "emb"}).status_code == 200
    rerank = {"query": "a cat", "texts": texts, "model": "rr"}
    assert server.post("/rerank", rerank).status_code == 200
    assert server.post("/rerank", rerank).status_code == 200
    assert server.post("/embed", {"inputs": "x", "model": "rr"}).status_code == 424
    assert server.post("/embed", {"inputs": "x", "model": "nope"}).status_code == 404
    text = server.get("/metrics").text
    check_exposition(text)
    got = samples(text)

    def sample(name: str, **labels: str) -> float:
        return got.get((name, frozenset(labels.items())), 0.0)

    assert sample("te_request_count", model="emb", method="single") == 1
    assert sample("te_request_count", model="emb", method="batch") == 1
    assert sample("te_request_count", model="rr", method="batch") == 2
    assert sample("te_request_success", model="rr", method="batch") == 2
    assert sample("te_request_duration_count", model="emb") == 2
    assert sample("te_request_duration_count", model="rr") == 2
    # Per input: 1 + 3 embedded, 2 x 3 pairs ranked.
    assert sample("te_request_input_length_count", model="emb") == 4
    assert sample("te_request_input_length_count", model="rr") == 6
    assert sample("te_queue_size", model="rr") == 0
    assert sample("te_batch_inference_success", model="emb") >= 1
    assert sample("te_batch_inference_success", model="rr") >= 1
    # A refusal of a chosen model is that model's; one that chose none is the server's.
    assert sample("te_request_failure", model="rr", err="model_type") == 1
    assert sample("te_request_failure", err="model_not_found") == 1
    # No request series without its model; the connections are the server's.
    assert not [key for key in got if key[0] == "te_request_count" and len(key[1]) < 2]
    assert ("te_connection_open", frozenset()) in got
