"""What the ranks of a 2-process launch wrote: one JSON file per rank and scenario."""

from __future__ import annotations

import json
from pathlib import Path


def rank_results(out: Path, scenario: str, log: str) -> dict[int, dict]:
    """``out/<scenario>/rank{0,1}.json`` read back; a rank that wrote nothing fails with the log's tail."""
    results = {}
    for rank in (0, 1):
        path = out / scenario / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing for {scenario!r}:\n{log[-3000:]}"
        results[rank] = json.loads(path.read_text())
    return results
