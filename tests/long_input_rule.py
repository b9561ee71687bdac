"""The `long_input: chunk` rule computed from its statement (docs/server.md "Long inputs")
with sentence-transformers, independently of the router's code: the text's tokens without
special tokens, cut into windows of the limit less [CLS] and [SEP] overlapping by `overlap`,
each window framed and pooled by the sentence-transformers model in float32 on the CPU, the
pooled vectors averaged weighted by each window's token count, then normalized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer


class ChunkRule:
    def __init__(self, folder: Path, limit: int) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device="cpu").float().eval()
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.cls = self.tokenizer.token_to_id("[CLS]")
        self.sep = self.tokenizer.token_to_id("[SEP]")
        self.window = limit - 2

    def windows(self, text: str, overlap: int) -> list[list[int]]:
        body = self.tokenizer.encode(text, add_special_tokens=False).ids
        starts = [0]
        while starts[-1] + self.window < len(body):
            starts.append(starts[-1] + self.window - overlap)
        return [body[s : s + self.window] for s in starts]

    def pooled(self, ids: list[int]) -> np.ndarray:
        features = {
            "input_ids": torch.tensor([ids]),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long),
        }
        with torch.no_grad():
            out = self.model(features)["sentence_embedding"][0]
        return out.double().numpy()

    def embed(self, text: str, overlap: int = 0) -> np.ndarray:
        windows = self.windows(text, overlap)
        vectors = [self.pooled([self.cls, *w, self.sep]) for w in windows]
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        mean = (np.stack(vectors) * weights[:, None]).sum(axis=0) / weights.sum()
        return mean / np.linalg.norm(mean)

    def tokens(self, text: str, overlap: int = 0) -> int:
        """Tokens the windows run, [CLS] and [SEP] included."""
        return sum(len(w) + 2 for w in self.windows(text, overlap))


def document(words: int, seed: int) -> str:
    """`words` one-token words of the test vocabulary."""
    from checkpoints.vocab import WORDS

    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
