"""The Rust router, compiled into the package by maturin (see rust_router/)."""

def run(argv: list[str]) -> int:
    """Parses `argv` (TEI's flags), serves until SIGINT/SIGTERM, returns the exit status."""

def model_info_fields() -> list[str]:
    """The keys of `Backend.info()` the router reads (its `ModelInfo` contract)."""
