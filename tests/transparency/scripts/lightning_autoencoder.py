"""Lightning: the ``LitAutoEncoder`` of Lightning's README (an encoder and a decoder, MSE
reconstruction, Adam in ``configure_optimizers``), trained by ``L.Trainer`` on random 28x28
images, checkpointed by Lightning's ``ModelCheckpoint`` and loaded back with
``LitAutoEncoder.load_from_checkpoint``. The door is leafwatch's ``LeafWatch`` callback.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from _transparency import arguments, door, logdir, print_loss
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 8


class LitAutoEncoder(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))

    def training_step(self, batch, batch_idx):
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = F.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        print_loss(self.global_step + 1, loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def load(out: Path) -> dict:
    (checkpoint,) = (out / "checkpoints").glob("*.ckpt")
    return LitAutoEncoder.load_from_checkpoint(checkpoint).state_dict()


if __name__ == "__main__":
    out, args = arguments(load)
    L.seed_everything(0)
    dataset = TensorDataset(torch.rand(STEPS * 8, 1, 28, 28), torch.zeros(STEPS * 8))
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=str(out / "checkpoints"))]
    if door() == "lightning":
        from leafwatch import LeafWatch

        callbacks.append(LeafWatch())
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, callbacks=callbacks,
                        logger=L.pytorch.loggers.TensorBoardLogger(str(logdir(out)), name="", version=""),
                        enable_progress_bar=False, enable_model_summary=False, deterministic=True)
    trainer.fit(LitAutoEncoder(), DataLoader(dataset, batch_size=8, shuffle=True))
