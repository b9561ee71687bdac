"""The Rust router, compiled into the package by maturin (see rust_router/)."""

def run(argv: list[str]) -> int:
    """Parses `argv` (TEI's flags), serves until SIGINT/SIGTERM, returns the exit status."""

def model_info_fields() -> list[str]:
    """The keys of `Backend.info()` the router reads (its `ModelInfo` contract)."""

def run_device_worker(spec: str) -> int:
    """A device worker's life (`trt_tei_runtime.device_worker`): load the backend for the
    spec's one device, serve the router's lanes until it closes them; the exit status."""

def preprocess_image(
    steps_json: str, data: bytes, max_pixels: int
) -> tuple[tuple[int, int, int], bytes]:
    """An image's pixels as the router makes them in Rust under `steps_json` (the JSON of
    `ImagePreprocessor.steps()`): their shape and float32 bytes. `ValueError` for steps or
    an image the router leaves to the runtime's preprocessing."""

class FlatTokenizer:
    """A `tokenizer.json` without its own truncation and padding, with the router's encode
    rules for a model of `max_length` tokens: its prompts, default prompt name, pair template
    `(before_query, between, after_document, suffix_ids)` and adapters."""

    def __init__(
        self,
        path: str,
        max_length: int,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
        pair_template: tuple[str, str, str, list[int]] | None = None,
        adapters: dict[str, int] | None = None,
    ) -> None: ...
    def encode(
        self,
        texts: list[str],
        prompt_name: str | None = None,
        truncate: bool = True,
        left: bool = False,
    ) -> tuple[bytes, bytes, bytes]:
        """`(ids, type_ids, lengths)` of texts to embed, little-endian u32, all ids end to end
        (`type_ids` empty when all are 0), as the router encodes them (prompt, special
        tokens, truncation, adapter). Raises `ValueError(message, kind, index, given)`, kind
        "too_long", "unknown_prompt" or "tokenizer"."""
    def encode_windows(
        self,
        texts: list[str],
        prompt_name: str | None = None,
        overlap: int = 0,
        max_chunks: int = 64,
    ) -> tuple[tuple[bytes, bytes, bytes], bytes, bytes]:
        """`long_input: chunk` as the router cuts texts: `(ids, type_ids, lengths)` of every
        window end to end, each text's window count, each window's weight (u32 LE). Raises
        `ValueError(message, kind, index, given)`, kind also "too_many_chunks" (`given`: the
        windows needed) or "chunk_overlap"."""
    def encode_pairs(
        self,
        inputs: list[tuple[str, str | None]],
        truncate: bool = True,
        left: bool = False,
    ) -> tuple[bytes, bytes, bytes]:
        """`encode` for inputs to score: a text as given, or a `(query, document)` pair (with
        the model's pair template if it has one)."""
    def adapter(self, prompt_name: str | None = None) -> int:
        """The adapter index the router gives a text embedded with `prompt_name`."""
    def token_to_id(self, token: str) -> int | None: ...
    def id_to_token(self, id: int) -> str | None: ...
    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens, no truncation."""
