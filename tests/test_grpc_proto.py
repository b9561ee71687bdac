"""rust_router/proto/tei.proto against the facts of TEI's published `tei.v1` API
(tests/tei_grpc_facts.json): every service, method, streaming shape, message, field number
and type, and enum value of TEI's file is there unchanged, so a client generated from TEI's
file works; this server's own fields take numbers TEI does not use."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from grpc_stubs import generate

FACTS: dict[str, Any] = json.loads((Path(__file__).parent / "tei_grpc_facts.json").read_text())
SHAPES = {
    (False, False): "unary",
    (True, True): "bidi",
    (True, False): "client_stream",
    (False, True): "server_stream",
}


def type_name(field: Any) -> str:
    """A field's type as the facts write it: `string`, `Metadata`, `repeated float`..."""
    if field.message_type is not None:
        name = field.message_type.name
    elif field.enum_type is not None:
        name = field.enum_type.name
    else:
        scalars = {
            field.TYPE_STRING: "string",
            field.TYPE_BOOL: "bool",
            field.TYPE_UINT32: "uint32",
            field.TYPE_UINT64: "uint64",
            field.TYPE_FLOAT: "float",
        }
        name = scalars.get(field.type, f"type#{field.type}")
    return f"repeated {name}" if field.is_repeated else name


def describe(descriptor: Any) -> dict[str, Any]:
    """A compiled proto file in the facts' shape."""
    services = {
        service.name: {
            m.name: [
                m.input_type.name,
                m.output_type.name,
                SHAPES[(m.client_streaming, m.server_streaming)],
            ]
            for m in service.methods
        }
        for service in descriptor.services_by_name.values()
    }
    messages = {
        message.name: {f.name: [f.number, type_name(f)] for f in message.fields}
        for message in descriptor.message_types_by_name.values()
    }
    enums = {
        enum.name: {v.name: v.number for v in enum.values}
        for enum in descriptor.enum_types_by_name.values()
    }
    return {
        "package": descriptor.package,
        "services": services,
        "messages": messages,
        "enums": enums,
    }


def mismatches(facts: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Where `ours` breaks TEI's API: a changed or missing fact, a method added to one of
    TEI's services, an enum value added to one of TEI's enums, or a field of our own whose
    number is below the extensions' range."""
    found = []
    if ours["package"] != facts["package"]:
        found.append(f"package {ours['package']}")
    for service, methods in facts["services"].items():
        if ours["services"].get(service) != methods:
            found.append(f"service {service}: {ours['services'].get(service)}")
    for enum, values in facts["enums"].items():
        if ours["enums"].get(enum) != values:
            found.append(f"enum {enum}: {ours['enums'].get(enum)}")
    for message, fields in facts["messages"].items():
        got = ours["messages"].get(message)
        if got is None:
            found.append(f"message {message} is missing")
            continue
        for name, fact in fields.items():
            if got.get(name) != fact:
                found.append(f"{message}.{name}: {got.get(name)}, TEI's is {fact}")
        for name, (number, _) in got.items():
            if name not in fields and number < facts["extensions_from"]:
                found.append(f"{message}.{name}: extension numbered {number}")
    return found


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("grpc_tools")
    messages, _ = generate(tmp_path_factory.mktemp("tei_stubs"))
    return describe(messages.DESCRIPTOR)


def test_proto_keeps_every_fact_of_teis_api(ours: dict[str, Any]) -> None:
    assert mismatches(FACTS, ours) == []
    # No service of TEI's was left out, and none of ours is extra.
    assert set(ours["services"]) == set(FACTS["services"])


def test_extensions_are_the_documented_ones(ours: dict[str, Any]) -> None:
    extensions = {
        f"{message}.{name}"
        for message, fields in ours["messages"].items()
        for name in fields
        if name not in FACTS["messages"].get(message, {})
    }
    assert {e.split(".")[1] for e in extensions} == {"model", "priority", "dimensions", "top_n"}
    assert "EmbedRequest.dimensions" in extensions
    assert "RerankRequest.top_n" in extensions
    assert "InfoRequest.model" in extensions
    assert ours["enums"]["Priority"] == {
        "PRIORITY_UNSPECIFIED": 0,
        "PRIORITY_HIGH": 1,
        "PRIORITY_LOW": 2,
    }


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda o: o["messages"]["EmbedRequest"].update(normalize=[7, "bool"]), "normalize"),
        (lambda o: o["messages"]["Rank"].update(index=[1, "uint64"]), "Rank.index"),
        (lambda o: o["services"]["Rerank"]["RerankStream"].__setitem__(2, "bidi"), "Rerank"),
        (lambda o: o["messages"]["EmbedRequest"].update(model=[6, "string"]), "numbered 6"),
        (lambda o: o["enums"]["ModelType"].update(MODEL_TYPE_SPARSE=3), "ModelType"),
        (lambda o: o["services"]["Embed"].pop("EmbedAll"), "Embed"),
    ],
)
def test_a_broken_fact_is_named(ours: dict[str, Any], change: Any, named: str) -> None:
    """The comparison itself: each kind of break in our file is reported."""
    broken = copy.deepcopy(ours)
    change(broken)
    found = mismatches(FACTS, broken)
    assert any(named in line for line in found), found
