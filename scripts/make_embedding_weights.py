"""Write notebooks/data/embedding_weights.npy, the toy model tutorial 06 embeds text with: a (128, 16) float32
projection of hashed word counts (8 KB), drawn from a fixed seed so every run writes the same bytes.

    .venv/bin/python scripts/make_embedding_weights.py
"""

from __future__ import annotations

from pathlib import Path

BUCKETS, DIM, SEED = 128, 16, 26
PATH = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "embedding_weights.npy"


def main() -> None:
    import numpy as np

    weights = np.random.default_rng(SEED).standard_normal((BUCKETS, DIM)).astype(np.float32)
    PATH.parent.mkdir(parents=True, exist_ok=True)
    np.save(PATH, weights)
    print(f"wrote {PATH} ({PATH.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
