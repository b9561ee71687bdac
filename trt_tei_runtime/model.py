"""`Model`: the runtime without a server, in the spirit of `SentenceTransformer.encode`."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .batch import PackedBatch, token_budget_batches
from .errors import InputError
from .inference import InferenceModel, ModelInfo, load_inference_model
from .pooling import apply_score_activation, finish_embeddings
from .tokenization import TextOrPair, TextTokenizer

DEFAULT_MAX_BATCH_TOKENS = 16384


class Model:
    """An embedding, reranking or classification model loaded from a checkpoint folder or hub id.

    >>> model = Model("sentence-transformers/all-MiniLM-L6-v2")
    >>> model.embed(["a query", "a document"]).shape
    (2, 384)
    """

    def __init__(
        self,
        model_id_or_path: str | os.PathLike[str],
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        pooling: str | None = None,
        *,
        revision: str | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        task: str | None = None,
        cuda_graphs: bool | None = None,
    ) -> None:
        if max_batch_tokens <= 0:
            raise InputError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
        self._model: InferenceModel = load_inference_model(
            model_id_or_path,
            revision=revision,
            device=device,
            dtype=dtype,
            pooling=pooling,
            task=task,
            cuda_graphs=cuda_graphs,
            max_num_tokens=max_batch_tokens,
        )
        self.info: ModelInfo = self._model.info
        self.tokenizer = TextTokenizer(self.info.model_dir, self.info.max_input_length)
        # A batch must hold at least one sequence of the maximum length.
        self.max_batch_tokens = max(max_batch_tokens, self.info.max_input_length)

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def dtype(self) -> torch.dtype:
        return self._model.dtype

    def embed(
        self,
        texts: str | Sequence[str],
        normalize: bool = True,
        dimensions: int | None = None,
        prompt_name: str | None = None,
        truncate: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Embeddings `(n, dim)` float32; `dimensions` truncates (Matryoshka) before normalizing."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if dimensions is not None and not 0 < dimensions <= self.info.hidden_size:
            raise InputError(
                f"dimensions must be between 1 and {self.info.hidden_size}, got {dimensions}"
            )
        ids = self.tokenize(texts, prompt_name=prompt_name, truncate=truncate)
        return self.embed_ids(
            ids, normalize=normalize, dimensions=dimensions, show_progress_bar=show_progress_bar
        )

    def tokenize(
        self,
        texts: str | Sequence[str],
        *,
        prompt_name: str | None = None,
        truncate: bool = True,
    ) -> list[list[int]]:
        """Token ids of each text as `embed` feeds them to the model (prompt and special
        tokens included, truncated to the model's limit unless `truncate=False`)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        prompt = self._prompt(prompt_name)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"input {i} must be a string, got {type(text).__name__}")
        return [
            e.ids for e in self.tokenizer.encode([prompt + t for t in texts], truncate=truncate)
        ]

    def embed_ids(
        self,
        ids: Sequence[Sequence[int]],
        normalize: bool = True,
        dimensions: int | None = None,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """`embed` on token ids from `tokenize` (or any tokenizer of the model's vocabulary):
        `(n, dim)` float32. Every sequence needs at least one token."""
        if dimensions is not None and not 0 < dimensions <= self.info.hidden_size:
            raise InputError(
                f"dimensions must be between 1 and {self.info.hidden_size}, got {dimensions}"
            )
        ids = [list(seq) for seq in ids]
        outputs = self._run_ids(
            ids, [[0] * len(seq) for seq in ids], show_progress_bar, self._model.embed
        )
        if outputs is None:
            return np.zeros((0, dimensions or self.info.hidden_size), dtype=np.float32)
        return finish_embeddings(outputs, normalize=normalize, dimensions=dimensions).numpy()

    def predict(
        self,
        texts_or_pairs: TextOrPair | Sequence[TextOrPair],
        raw_scores: bool = False,
        truncate: bool = True,
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Scores `(n, num_labels)`: sigmoid/softmax as TEI applies them, or raw logits.

        For a model with a pair template (yes/no rerankers), each (query, document) pair is
        formatted with it; a single string is scored as given (already formatted)."""
        items = _as_items(texts_or_pairs)
        suffixes = None
        template = self.info.pair_template
        if template is not None:
            suffixes = [template.suffix_ids if _is_pair(it) else () for it in items]
            items = [template.head(*it) if _is_pair(it) else it for it in items]  # type: ignore[misc]
        logits = self._run(items, truncate, show_progress_bar, self._model.predict, suffixes)
        if logits is None:
            return np.zeros((0, self.info.num_labels), dtype=np.float32)
        if not raw_scores:
            logits = apply_score_activation(logits, self.info.score_activation)
        return logits.numpy()

    def rerank(
        self,
        query: str,
        texts: Sequence[str],
        raw_scores: bool = False,
        truncate: bool = True,
        top_n: int | None = None,
    ) -> list[tuple[int, float]]:
        """(index into `texts`, score) pairs, best first."""
        if self.info.model_type != "reranker":
            raise InputError(
                f"rerank needs a single-label reranker; this model is a {self.info.model_type}"
            )
        scores = self.predict([(query, t) for t in texts], raw_scores=raw_scores, truncate=truncate)
        order = sorted(range(len(texts)), key=lambda i: -float(scores[i, 0]))
        return [(i, float(scores[i, 0])) for i in order[:top_n]]

    def _prompt(self, prompt_name: str | None) -> str:
        name = prompt_name or self.info.default_prompt_name
        if name is None:
            return ""
        if name not in self.info.prompts:
            raise InputError(
                f"unknown prompt_name {name!r}; the model has {sorted(self.info.prompts) or 'none'}"
            )
        return self.info.prompts[name]

    def _run(self, items, truncate, show_progress_bar, forward, suffixes=None):  # type: ignore[no-untyped-def]
        """Tokenizes, runs token-budget batches longest first, returns rows in input order.

        `suffixes[i]` (token ids) is appended to item i after truncation, which keeps it."""
        if not items:
            return None
        encodings = self.tokenizer.encode(items, truncate=truncate)
        ids = [e.ids for e in encodings]
        type_ids = [e.type_ids for e in encodings]
        for i, suffix in enumerate(suffixes or ()):
            if suffix:
                ids[i] = self._with_suffix(ids[i], suffix, truncate, i)
                type_ids[i] = [0] * len(ids[i])
        return self._run_ids(ids, type_ids, show_progress_bar, forward)

    def _run_ids(self, ids, type_ids, show_progress_bar, forward):  # type: ignore[no-untyped-def]
        """Runs token-budget batches longest first; rows come back in input order."""
        if not ids:
            return None
        lengths = [len(s) for s in ids]
        for i, n in enumerate(lengths):
            if n == 0:
                raise InputError(f"input {i} is empty after tokenization")
        batches = token_budget_batches(lengths, self.max_batch_tokens)
        results: list[torch.Tensor | None] = [None] * len(ids)
        progress = tqdm(
            total=len(ids),
            disable=(not show_progress_bar)
            if show_progress_bar is not None
            else (len(batches) < 2 or None),
            unit="input",
        )
        with progress:
            for indices in batches:
                batch = PackedBatch.from_sequences(
                    [ids[i] for i in indices],
                    [type_ids[i] for i in indices],
                    self.info.position_offset,
                )
                out = forward(batch).cpu()
                for row, i in enumerate(indices):
                    results[i] = out[row]
                progress.update(len(indices))
        return torch.stack(results)  # type: ignore[arg-type]

    def _with_suffix(
        self, ids: list[int], suffix: tuple[int, ...], truncate: bool, index: int
    ) -> list[int]:
        limit = self.info.max_input_length
        if len(ids) + len(suffix) <= limit:
            return ids + list(suffix)
        if not truncate:
            raise InputError(
                f"input {index} has {len(ids) + len(suffix)} tokens with its prompt template, "
                f"more than the model's maximum of {limit}; pass truncate=True to cut it"
            )
        if len(suffix) >= limit:
            raise InputError(
                f"the prompt template's suffix alone ({len(suffix)} tokens) fills the model's "
                f"maximum input length {limit}"
            )
        return ids[: limit - len(suffix)] + list(suffix)


def _as_items(texts_or_pairs: TextOrPair | Sequence[TextOrPair]) -> list[TextOrPair]:
    """A string or a tuple of two strings is one input; a list holds several."""
    if isinstance(texts_or_pairs, str):
        return [texts_or_pairs]
    if (
        isinstance(texts_or_pairs, tuple)
        and len(texts_or_pairs) == 2
        and all(isinstance(x, str) for x in texts_or_pairs)
    ):
        return [(texts_or_pairs[0], texts_or_pairs[1])]  # type: ignore[list-item]
    return list(texts_or_pairs)


def _is_pair(item: object) -> bool:
    return (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and all(isinstance(part, str) for part in item)
    )
