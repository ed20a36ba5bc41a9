"""A LightningModule whose ``training_step`` returns its loss detached in the dict it logs from (the
``{"loss": ..., "log": ...}`` return of Lightning-AI/pytorch-lightning#2331 and #9299, with ``.detach()`` added to
the loss to log it): Lightning calls ``backward()`` on a tensor without a graph: "element 0 of tensors does not
require grad and does not have a grad_fn"."""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn

import leafwatch


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        return {"loss": loss.detach(), "log": {"train_loss": loss.detach()}}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
model = Regressor()
trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, callbacks=[leafwatch.LeafWatch()])
trainer.fit(model, data)
print("done")
