"""A LightningModule GAN whose discriminator optimizer lists one discriminator twice, as in
line/open-universe#5 (universe_gan.py's `configure_optimizers`: `params_disc = list(self.loss_mrd.parameters())
+ list(self.loss_mrd.parameters())`, where `self.loss_mpd` was meant): the multi-period discriminator is in no
optimizer and never trains. Manual optimization, one generator and one discriminator step per batch."""

import warnings

import pytorch_lightning as pl
import torch
from torch import nn

warnings.simplefilter("ignore", UserWarning)  # duplicate parameters, Lightning's hints


class MultiResolutionDiscriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.LeakyReLU(0.1), nn.Conv1d(8, 1, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x.unsqueeze(1)).mean(-1)


class MultiPeriodDiscriminator(nn.Module):
    def __init__(self, period: int = 4) -> None:
        super().__init__()
        self.period = period
        self.convs = nn.Sequential(nn.Conv2d(1, 8, (3, 1), padding=(1, 0)), nn.LeakyReLU(0.1), nn.Conv2d(8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x.view(x.shape[0], 1, -1, self.period)).flatten(1).mean(-1, keepdim=True)


class UniverseGAN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64))
        self.loss_mrd = MultiResolutionDiscriminator()
        self.loss_mpd = MultiPeriodDiscriminator()

    def training_step(self, batch, batch_idx):
        optimizer_gen, optimizer_disc = self.optimizers()
        noisy, clean = batch
        fake = self.generator(noisy)
        real_score = self.loss_mrd(clean) + self.loss_mpd(clean)
        fake_score = self.loss_mrd(fake.detach()) + self.loss_mpd(fake.detach())
        loss_disc = (1 - real_score).pow(2).mean() + fake_score.pow(2).mean()
        optimizer_disc.zero_grad()
        self.manual_backward(loss_disc)
        optimizer_disc.step()
        loss_gen = (1 - self.loss_mrd(fake) - self.loss_mpd(fake)).pow(2).mean() + (fake - clean).abs().mean()
        optimizer_gen.zero_grad()
        self.manual_backward(loss_gen)
        optimizer_gen.step()

    def configure_optimizers(self):
        optimizer_gen = torch.optim.AdamW(self.generator.parameters(), lr=2e-4, betas=(0.8, 0.99))
        # optimizer discriminator
        params_disc = list(self.loss_mrd.parameters()) + list(
            self.loss_mrd.parameters()
        )
        optimizer_disc = torch.optim.AdamW(params_disc, lr=2e-4, betas=(0.8, 0.99))
        return [optimizer_gen, optimizer_disc]


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randn(32, 64))
model = UniverseGAN()
trainer = pl.Trainer(max_steps=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
print("trained")
