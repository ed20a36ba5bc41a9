"""What every transparency script shares: its command line, its printed losses, its door, its digest.

A script is a short real training run, written the way its library's docs write one. It is run as
``python script.py OUT [args]`` (plainly, under ``leafwatch run``, or with ``TRANSPARENCY_DOOR`` set
to the library's own leafwatch door), prints one ``loss STEP HEX`` line per optimizer step (the
float's exact bits) and saves its checkpoint under ``OUT``. ``python script.py --load OUT...``
loads each checkpoint the way the library does in a process that never imports leafwatch, and
prints ``loaded OUT DIGEST``: the sha256 of the loaded weights, equal only when every bit is.

This module imports neither torch nor leafwatch: each script imports what it needs.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: The environment variable that turns on the library's own leafwatch door: ``monitor`` (a
#: ``leafwatch.Monitor(model, optimizers).attach()``), ``lightning`` (the ``LeafWatch`` callback),
#: ``transformers`` (the ``LeafWatchCallback``). Unset: no leafwatch in the script.
DOOR = "TRANSPARENCY_DOOR"


def door() -> str | None:
    return os.environ.get(DOOR) or None


def logdir(out: Path) -> Path:
    """Where a door writes leafwatch's TensorBoard records (``leafwatch report`` reads them)."""
    return out / "records"


def print_loss(step: int, loss: Any) -> None:
    """One line per optimizer step, the loss's exact float (``float.hex``)."""
    value = loss.detach().item() if hasattr(loss, "detach") else float(loss)
    print(f"loss {step} {float(value).hex()}", flush=True)


def attach_monitor(model: Any, optimizers: Any, out: Path) -> Any:
    """Under ``TRANSPARENCY_DOOR=monitor``, a ``leafwatch.Monitor`` attached to the model and its
    optimizers, writing to :func:`logdir`, as a user adds one next to their optimizer; None otherwise."""
    if door() != "monitor":
        return None
    import leafwatch
    from torch.utils.tensorboard import SummaryWriter

    return leafwatch.Monitor(model, optimizers, writer=SummaryWriter(str(logdir(out)))).attach()


def close_monitor(monitor: Any) -> None:
    if monitor is not None:
        monitor.close()


def digest(state_dict: Mapping[str, Any]) -> str:
    """sha256 of a state dict's keys, dtypes, shapes and bytes, in key order (nested dicts too)."""
    import torch

    hasher = hashlib.sha256()

    def feed(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key in sorted(value, key=str):
                feed(f"{prefix}.{key}", value[key])
        elif isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            hasher.update(f"{prefix}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            hasher.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            hasher.update(f"{prefix}={value!r}".encode())

    feed("", state_dict)
    return hasher.hexdigest()


def arguments(load: Callable[[Path], Mapping[str, Any]]) -> tuple[Path, list[str]]:
    """``script.py OUT [args]``: returns OUT (created) and the args, for the script's training.
    ``script.py --load OUT...``: loads each OUT's checkpoint with ``load``, prints its digest, and
    exits (1 when leafwatch was imported)."""
    args = sys.argv[1:]
    if args[:1] == ["--load"]:
        for out in args[1:]:
            print(f"loaded {out} {digest(load(Path(out)))}", flush=True)
        if any(name == "leafwatch" or name.startswith("leafwatch.") for name in sys.modules):
            raise SystemExit("leafwatch was imported while loading the checkpoints")
        raise SystemExit(0)
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    return out, args[1:]
