"""The Hugging Face ``Trainer`` callback, at its public import path.

``from leafwatch.transformers import LeafWatchCallback``; it lives in
:mod:`leafwatch.integrations.transformers` (this module only re-exports it).

Example::

    >>> from transformers import Trainer
    >>> from leafwatch.transformers import LeafWatchCallback
    >>> callback = LeafWatchCallback()  # Trainer(model, args, train_dataset=..., callbacks=[callback])
"""

from __future__ import annotations

from .integrations.transformers import INSTALL_HINT, LeafWatchCallback

__all__ = ["INSTALL_HINT", "LeafWatchCallback"]
