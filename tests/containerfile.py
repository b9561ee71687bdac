"""Reads the final stage of the project's Containerfile: its ENV, ENTRYPOINT, CMD and
HEALTHCHECK, so tests can run the image's entry point as the image would, outside it."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

CONTAINERFILE = Path(__file__).parents[1] / "Containerfile"


@dataclass
class ImageConfig:
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    user: str = ""
    volumes: list[str] = field(default_factory=list)
    exposed: list[str] = field(default_factory=list)

    @property
    def command(self) -> list[str]:
        return self.entrypoint + self.cmd


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def _exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    if not (isinstance(parsed, list) and all(isinstance(a, str) for a in parsed)):
        raise ValueError(f"expected a JSON list of strings, got {args!r}")
    return parsed


def read_image_config(path: Path = CONTAINERFILE, base_env: dict[str, str] | None = None):
    """The final stage's configuration. `base_env` stands for the base image's environment
    (PATH above all), against which `$VAR` in ENV values expand."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in _instructions(path.read_text()):
        if keyword == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append((keyword, args))
    if not stages:
        raise ValueError(f"{path} has no FROM")
    config = ImageConfig()
    env = dict(base_env or {})
    for keyword, args in stages[-1]:
        if keyword == "ENV":
            for pair in shlex.split(args):
                key, _, value = pair.partition("=")
                env[key] = config.env[key] = _expand(value, env)
        elif keyword == "ENTRYPOINT":
            config.entrypoint = _exec_form(args)
        elif keyword == "CMD":
            config.cmd = _exec_form(args)
        elif keyword == "HEALTHCHECK":
            config.healthcheck = _exec_form(args[args.index("CMD") + len("CMD") :].strip())
        elif keyword == "USER":
            config.user = args
        elif keyword == "VOLUME":
            config.volumes += args.split()
        elif keyword == "EXPOSE":
            config.exposed += args.split()
    return config
