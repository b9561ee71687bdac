"""What can go wrong in a corpus job, told apart by how the command exits."""

from __future__ import annotations

from ..errors import InputError


class CorpusError(InputError):
    """Bad arguments or input (missing file, unknown format, missing column, bad output dir):
    the job never starts. `trt-tei-embed` exits with status 2."""


class OutputMismatchError(CorpusError):
    """The output folder holds a job with other output-affecting options, another input or
    another model; `--overwrite` starts over."""


class BadRowError(InputError):
    """A row has no usable text and `--on-bad-row fail` (the default) is in force. The shards
    finished before it are kept; `trt-tei-embed` exits with status 1."""
