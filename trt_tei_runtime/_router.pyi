"""The Rust router, compiled into the package by maturin (see rust_router/)."""

def run(argv: list[str]) -> int:
    """Parses `argv` (TEI's flags), serves until SIGINT/SIGTERM, returns the exit status."""

def model_info_fields() -> list[str]:
    """The keys of `Backend.info()` the router reads (its `ModelInfo` contract)."""

class FlatTokenizer:
    """A `tokenizer.json` without its own truncation and padding, for the runtime's batches."""

    def __init__(self, path: str, max_length: int) -> None: ...
    def encode(
        self,
        texts: list[str],
        prompt: str = "",
        truncate: bool = True,
        add_special_tokens: bool = True,
    ) -> tuple[bytes, bytes]:
        """`(ids, lengths)` of `prompt + text` per text, little-endian u32, all ids end to end.
        `truncate` cuts at `max_length`, special tokens kept."""
