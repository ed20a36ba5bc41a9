"""x-transformers under Lightning: the same stochastic-depth decoder (``Decoder(layer_dropout=...)``)
in a ``LightningModule`` whose ``training_step`` returns ``AutoregressiveWrapper``'s loss, trained by
a ``Trainer`` (the library's own leafwatch door: the ``LeafWatch`` callback). The checkpoint is
Lightning's own (``trainer.save_checkpoint``), loaded with ``load_from_checkpoint``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytorch_lightning as pl
import torch
from _transparency import arguments, door, logdir, print_loss
from torch.utils.data import DataLoader
from x_transformers import AutoregressiveWrapper, Decoder, TransformerWrapper

SEQ_LEN, STEPS = 32, 30


class LitDecoder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = AutoregressiveWrapper(TransformerWrapper(
            num_tokens=256, max_seq_len=SEQ_LEN, attn_layers=Decoder(dim=32, depth=4, heads=2, layer_dropout=0.3)))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model(batch)
        print_loss(self.global_step + 1, loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def load(out: Path) -> dict:
    return LitDecoder.load_from_checkpoint(out / "decoder.ckpt").state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    random.seed(0)
    pl.seed_everything(0)
    callbacks = []
    if door() == "lightning":
        from leafwatch import LeafWatch

        callbacks.append(LeafWatch())
    logger = pl.loggers.TensorBoardLogger(str(logdir(out)), name="", version="") if door() else False
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, callbacks=callbacks, logger=logger,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         gradient_clip_val=0.5, deterministic=True)
    data = DataLoader(torch.randint(0, 256, (STEPS * 4, SEQ_LEN)), batch_size=4, shuffle=True)
    trainer.fit(LitDecoder(), data)
    trainer.save_checkpoint(out / "decoder.ckpt")
